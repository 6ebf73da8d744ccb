"""The relaxed frontier where it is needed (the ``"sandwich"`` relaxation core).

Exact solves at a few deadlines, certified between them by their tangent lines.

Each deadline ``T`` is solved exactly as the LP's dual, a minimum-cost circulation on the
node-split DAG (:mod:`perseus.kernels.network_simplex`): node ``i`` is an "in" vertex ``i`` and
an "out" vertex ``n + i`` joined by one arc per hull vertex ``k`` of cost ``-tau_k`` (durations
in integer nanoseconds) and capacity the difference of the slopes on either side of the vertex
(the fastest vertex's arc unbounded); DAG edges, source and sink arcs cost nothing; a return
arc ``t -> s`` costs ``T``. A circulation's flow through node ``i`` is ``phi_i`` and through the
return arc ``F``; by Lagrangian duality **any** circulation certifies the line

    G(T') >= sum_i min_k (c_ik + phi_i tau_ik) - F T'     for every T',

which is recomputed in floats from the flows (so integer costs and capacities only cost
tightness, never the certificate); an optimal one makes it tangent at ``T``. The potentials give
start and finish times, hence durations feasible within ``T`` (an upper value of ``G``).

The deadlines are chosen by a chord-tangent sandwich on ``[T0, t_max]``: between two solved
deadlines ``G`` lies below the chord of their feasible values and above the maximum of their
tangents, so the gap at the tangents' crossing bounds the error of the bound there; an interval
whose gap exceeds ``tolerance`` times the energy bound is split at that crossing and solved,
round after round (each round a monotone pass from the end nearer the last solve, every solve
warm-started from the last), until none does. The bound is then :meth:`perseus.bound.RelaxedBound.tangents`
of every solve, and durations between two solved deadlines their convex combination.

Complexity: a solve is a warm-started network simplex on ``2n + 2`` vertices and ``n H + m``
arcs; the sandwich needs a few dozen solves (its count depends on ``G``'s curvature, not on
``n``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from perseus.errors import SolverCancelled
from perseus.kernels.network_simplex import init_tree, reprice, simplex
from perseus.problem import EnergyProblem
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.relaxation import Relaxation

__all__ = ["Circulation", "SandwichStats", "sandwich_frontier", "time_unit"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NS = 1e9  # cost unit: nanoseconds
_UNBOUNDED = np.int64(1) << 52
_PIVOTS_PER_CALL = 200_000  # cancelling is heard between calls


def time_unit(problem: EnergyProblem, hulls: Relaxation, finest: float = 1e12) -> float:
    """The finest time unit (at most ``finest`` per second) whose integer costs stay in ``int64``.

    The network simplex's potentials and reduced costs stay within ``int64`` (a margin of 8x).
    """
    total = float(np.where(np.isfinite(hulls.tau), np.abs(hulls.tau), 0.0).sum())
    total += float(problem.dag.iteration_time(hulls.longest))
    return float(min(finest, 2.0**59 / (6.0 * max(total, 1e-9))))


@dataclass
class SandwichStats:
    """What the sandwich did: deadlines solved, pivots (and how many degenerate), CPU s."""

    solves: int = 0
    pivots: int = 0
    degenerate: int = 0
    rounds: int = 0
    cpu: float = 0.0
    gaps: list[float] = field(default_factory=list)
    trace: list[tuple[float, int, float]] = field(default_factory=list)


class Circulation:
    """The node-split network of one problem and hull table, with its warm simplex state."""

    def __init__(self, problem: EnergyProblem, hulls: Relaxation, unit: float = NS) -> None:
        """Build the sandwich core.

        ``unit``: time units per second of the integer costs (default nanoseconds; the
        parallel sweep's range starts use picoseconds, :func:`time_unit`).
        """
        dag = problem.dag
        self.unit = unit
        n = problem.num_nodes
        self.problem, self.hulls, self.n = problem, hulls, n
        nv = hulls.nv
        tau_ns = np.rint(np.where(np.isfinite(hulls.tau), hulls.tau, 0.0) * unit).astype(np.int64)
        steep = float(np.abs(hulls.slope).max(axis=1).sum()) + 1.0
        self.cap_scale = min(1e6, 2.0**50 / steep)
        src: list[IntArray] = []
        dst: list[IntArray] = []
        cap: list[IntArray] = []
        cost: list[IntArray] = []
        owner: list[IntArray] = []
        width = hulls.tau.shape[1]
        for k in range(width):
            has = nv > k
            if k == 0:
                c = np.full(n, _UNBOUNDED)
            else:
                right = np.where(nv > k + 1, hulls.slope[:, min(k, width - 2)], 0.0)
                left = hulls.slope[:, k - 1]
                c = np.rint((right - left) * self.cap_scale).astype(np.int64)
            keep = has & (c > 0)
            idx = np.flatnonzero(keep)
            src.append(idx)
            dst.append(idx + n)
            cap.append(c[idx])
            cost.append(-tau_ns[idx, k])
            owner.append(idx)
        self.node_arcs = int(sum(len(a) for a in src))
        s, t = 2 * n, 2 * n + 1
        roots = np.flatnonzero(np.diff(dag.pred_ptr) == 0)
        leaves = np.flatnonzero(np.diff(dag.succ_ptr) == 0)
        src += [dag.src + n, np.full(len(roots), s), leaves + n, np.array([t])]
        dst += [dag.dst.astype(np.int64), roots, np.full(len(leaves), t), np.array([s])]
        extra = len(dag.src) + len(roots) + len(leaves)
        cap += [np.full(extra + 1, _UNBOUNDED)]
        cost += [np.zeros(extra + 1, np.int64)]
        nn = 2 * n + 2
        self.owner = np.concatenate(owner)
        arcs_src = np.concatenate(src).astype(np.int64)
        arcs_dst = np.concatenate(dst).astype(np.int64)
        self.ret = len(arcs_src) - 1  # the return arc t -> s
        costs = np.concatenate(cost).astype(np.int64)
        t_max_ns = int(np.rint(float(dag.iteration_time(hulls.longest)) * unit)) + 1
        big = 3 * (int(np.abs(costs).sum()) + t_max_ns) + 1
        # artificial arcs v -> root
        self.src = np.concatenate([arcs_src, np.arange(nn, dtype=np.int64)])
        self.dst = np.concatenate([arcs_dst, np.full(nn, nn, np.int64)])
        self.cap = np.concatenate([np.concatenate(cap), np.full(nn, _UNBOUNDED)]).astype(np.int64)
        self.cost = np.concatenate([costs, np.full(nn, big, np.int64)])
        self.flow = np.zeros(len(self.src), np.int64)
        tree = init_tree(nn, big)
        self.parent, self.pedge, self.size, self.nxt, self.prv, self.last, self.pi = tree
        self.pedge[:nn] = len(arcs_src) + np.arange(nn)
        self.state = np.zeros(3, np.int64)
        # integer fastest time: a deadline must exceed it, or zero-cost cycles are unbounded
        self.t0_ns = int(dag.iteration_time(tau_ns[:, 0].astype(np.float64)))
        valid = np.arange(width)[None, :] < nv[:, None]
        self._tau = np.where(valid, hulls.tau, 0.0)
        self._cost = np.where(valid, hulls.cost, np.inf)
        self._valid = valid

    def solve(
        self, deadline: float, cancel: Callable[[], bool] | None = None
    ) -> tuple[float, float, FloatArray]:
        """The circulation at ``deadline``, warm-started from the last: ``(L, F, durations)``.

        ``G(T') >= L - F (T' - deadline)`` for every ``T'`` (tangent at ``deadline``) and
        the durations are feasible within ``deadline``.
        """
        t_ns = max(int(np.rint(deadline * self.unit)), self.t0_ns + 1)
        self.cost[self.ret] = t_ns
        root = self.parent.shape[0] - 1
        reprice(self.src, self.dst, self.cost, self.parent, self.pedge, self.nxt, self.pi, root)
        while not simplex(
            self.src, self.dst, self.cap, self.cost, self.flow, self.parent, self.pedge,
            self.size, self.nxt, self.prv, self.last, self.pi, self.state, _PIVOTS_PER_CALL,
        ):  # fmt: skip
            if cancel is not None and cancel():
                raise SolverCancelled("frontier computation cancelled")
        n = self.n
        if self.flow[len(self.flow) - root :].any():
            raise RuntimeError("the relaxation's circulation kept flow on an artificial arc")
        phi = np.bincount(self.owner, self.flow[: self.node_arcs], minlength=n) / self.cap_scale
        big_f = float(self.flow[self.ret]) / self.cap_scale
        h = np.where(self._valid, self._cost + phi[:, None] * self._tau, np.inf).min(axis=1)
        lagrangian = float(h.sum()) - big_f * deadline
        pi = self.pi
        d = (pi[n : 2 * n] - pi[:n]).astype(np.float64) / self.unit
        d = np.clip(d, self.hulls.shortest, self.hulls.longest)
        return lagrangian, big_f, self._feasible(d, deadline)

    def _feasible(self, d: FloatArray, deadline: float) -> FloatArray:
        """``d`` pulled towards the shortest durations until it fits ``deadline``.

        It fits when its longest path is within ``deadline``.

        The potentials are integer nanoseconds. The longest path is convex in the durations,
        so the mix at ``(T - T0) / (T' - T0)`` fits.
        """
        dag = self.problem.dag
        lo = self.hulls.shortest
        t = float(dag.iteration_time(d))
        if t <= deadline:
            return d
        t0 = float(dag.iteration_time(lo))
        lam = max(0.0, (deadline - t0) / (t - t0)) if t > t0 else 0.0
        out: FloatArray = lo + lam * (d - lo)
        return out


def sandwich_frontier(
    problem: EnergyProblem,
    relaxation: Relaxation,
    *,
    hulls: Relaxation | None = None,
    tolerance: float = 5e-4,
    initial: int = 9,
    max_solves: int = 400,
    cancel: Callable[[], bool] | None = None,
    progress: Callable[[float], None] | None = None,
    stats: SandwichStats | None = None,
) -> RelaxedFrontier:
    """The relaxed frontier of ``problem`` as tangent lines at a few deadlines.

    See the module's docstring. The lines are certified within ``tolerance`` of the energy bound
    between them (or as close as ``max_solves`` solves get). ``hulls`` (default ``relaxation``)
    are the hulls solved (e.g. an :meth:`Relaxation.under_estimate`); ``relaxation`` stays the
    frontier's, for rounding. ``initial`` deadlines are solved first, from the slowest time
    down, spaced ever closer towards ``T0`` (where ``G`` bends most).
    """
    st = stats if stats is not None else SandwichStats()
    cpu = time.process_time()
    h = relaxation if hulls is None else hulls
    dag = problem.dag
    pr = problem.blocking_power * dag.num_ranks
    t0 = float(dag.iteration_time(h.shortest))
    t_max = float(dag.iteration_time(h.longest))
    net = Circulation(problem, h)
    hi_cost = float(h.cost[np.arange(len(h.nv)), h.nv - 1].sum())
    solved: dict[float, tuple[float, float, FloatArray, float]] = {}
    last = [t_max]  # the deadline the network's tree was last solved at

    tau_v, cost_v, nv_v = h.tau, h.cost, h.nv

    def value(d: FloatArray) -> float:
        """``sum_i c_i(d_i)`` on the solved hulls (an upper value of ``G`` where ``d`` fits)."""
        j = np.clip((d[:, None] >= tau_v).sum(axis=1) - 1, 0, nv_v - 2)
        j = np.maximum(j, 0)
        rows = np.arange(len(d))
        ta, tb = tau_v[rows, j], tau_v[rows, np.minimum(j + 1, nv_v - 1)]
        ca, cb = cost_v[rows, j], cost_v[rows, np.minimum(j + 1, nv_v - 1)]
        span = np.where(tb > ta, tb - ta, 1.0)
        w = np.clip((d - ta) / span, 0.0, 1.0)
        return float(((1 - w) * ca + w * cb).sum())

    def solve(t: float) -> None:
        if cancel is not None and cancel():
            raise SolverCancelled("frontier computation cancelled")
        if t >= t_max:
            # G is flat from t_max on: the zero circulation is optimal (no solve needed)
            d = h.longest.copy()
            solved[t] = (hi_cost, 0.0, d, hi_cost)
            return
        p0, c0 = int(net.state[1]), time.process_time()
        lag, big_f, d = net.solve(t, cancel)
        last[0] = t
        solved[t] = (lag, big_f, d, value(d))
        st.solves += 1
        st.trace.append(((t - t0) / (t_max - t0), int(net.state[1]) - p0, time.process_time() - c0))

    span = t_max - t0
    if span <= 0:
        solve(t_max)
        order = [t_max]
    else:
        first = [t_max] + [t0 + span * 0.5**k for k in range(1, initial - 1)] + [t0]
        for t in first:
            solve(t)
        order = sorted(solved)
    while span > 0 and st.solves < max_solves:
        st.rounds += 1
        ts = sorted(solved)
        splits = []
        worst = 0.0
        for a, b in zip(ts[:-1], ts[1:], strict=True):
            la, fa, _, ua = solved[a]
            lb, fb, _, ub = solved[b]
            # tangents: la - fa (x - a), lb - fb (x - b); they cross at x
            x = (la - lb + fa * a - fb * b) / (fa - fb) if fa != fb else 0.5 * (a + b)
            x = min(max(x, a + 1e-3 * (b - a)), b - 1e-3 * (b - a))
            low = max(la - fa * (x - a), lb - fb * (x - b))
            chord = ua + (ub - ua) * (x - a) / (b - a)
            gap = (chord - low) / (low + pr * x)
            worst = max(worst, gap)
            if gap > tolerance and b - a > 1e-9 * b:
                splits.append(x)
        st.gaps.append(worst)
        if progress is not None:
            progress(min(1.0, st.rounds / 8))
        if not splits:
            break
        # a monotone pass, from the end nearer the last solve (warm starts stay local)
        splits.sort(reverse=abs(splits[-1] - last[0]) < abs(splits[0] - last[0]))
        for x in splits[: max_solves - st.solves]:
            solve(x)
    order = sorted(solved)
    times = np.array(order)
    lags = np.array([solved[t][0] for t in order])
    slopes = -np.array([solved[t][1] for t in order])
    durs = np.stack([solved[t][2] for t in order])
    st.pivots, st.degenerate = int(net.state[1]), int(net.state[2])
    st.cpu += time.process_time() - cpu
    return RelaxedFrontier(
        relaxation=relaxation,
        times=times,
        costs=lags,
        kept_times=times,
        kept_durations=durs,
        t_min=t0,
        t_max=t_max,
        ranks_power=pr,
        slopes=slopes,
    )
