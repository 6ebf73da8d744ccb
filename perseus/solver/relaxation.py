"""The convex relaxation: per-node lower hulls, and the exact relaxed frontier they give.

Each node's Pareto-optimal options in (time, effective cost ``e - P t``) are replaced by the
lower convex hull of those points, a convex, decreasing, piecewise-linear cost of a continuous
duration. Minimising the sum of those costs subject to the longest path being at most ``T`` is a
linear program (the project time-cost trade-off problem) whose optimum ``G(T)`` is convex and
piecewise linear in ``T``; ``G(T) + P R T`` (``R`` ranks) is a certified lower bound on the
energy of any discrete plan within ``T``. :func:`relaxed_frontier` yields its breakpoints
(:mod:`perseus.kernels.relaxed` computes them); :func:`sweep_range` keeps them with a bounded
number of their durations, and :class:`~perseus.solver.breakpoints.RelaxedFrontier` holds them
all and interpolates between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.errors import SolverCancelled
from perseus.kernels.flow import split_graph
from perseus.kernels.relaxed import relaxed_chunk
from perseus.problem import EnergyProblem
from perseus.profiles import lower_hull_indices, pareto_indices

__all__ = [
    "Relaxation",
    "RelaxedStep",
    "relaxed_frontier",
    "path_bound",
    "sweep_range",
    "SweptSoFar",
    "thin_hull",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_INT_INF = 1 << 60  # "infinite" capacity; all finite capacities together stay below 2**52
_STEPS_PER_CHUNK = 64  # relaxed steps per compiled call (cancelling is heard between calls)
#: Hulls with fewer vertices than this are swept exactly (see :meth:`Relaxation.under_estimate`).
THIN_MIN_VERTICES = 16


@dataclass(frozen=True, eq=False)
class Relaxation:
    """Per-node convex hulls (padded to ``(n, H)``) of the Pareto-optimal options.

    ``tau[i, :nv[i]]`` are hull vertex durations (increasing), ``cost`` their effective costs,
    ``slope[i, k]`` the slope of segment ``k`` (negative, increasing in ``k``).
    ``pareto`` is a boolean ``(n, K)`` mask of options not dominated in (time, effective cost),
    ``hull_mask`` of the options that are hull vertices.
    """

    tau: FloatArray
    cost: FloatArray
    slope: FloatArray
    nv: IntArray
    pareto: BoolArray
    hull_mask: BoolArray

    @classmethod
    def build(cls, problem: EnergyProblem) -> Relaxation:
        """The hulls of ``problem``'s nodes (nodes with the same options share the work)."""
        n, k = problem.times.shape
        eff = problem.energies - problem.blocking_power * problem.times
        # Nodes of the same (stage, kind) share rows: compute each distinct row once.
        _, first, inverse = np.unique(
            np.concatenate([problem.times, eff], axis=1),
            axis=0,
            return_index=True,
            return_inverse=True,
        )
        inverse = inverse.reshape(-1)
        hulls = []
        masks = []
        hmasks = []
        for i in first:
            m = int(problem.num_options[i])
            par = pareto_indices(problem.times[i, :m], eff[i, :m])
            h = par[lower_hull_indices(problem.times[i, par], eff[i, par])]
            hulls.append((problem.times[i, h], eff[i, h]))
            mask = np.zeros(k, dtype=bool)
            mask[par] = True
            masks.append(mask)
            hm = np.zeros(k, dtype=bool)
            hm[h] = True
            hmasks.append(hm)
        tau_u, cost_u, slope_u, nv_u = _hull_table(hulls, max(len(t) for t, _ in hulls))
        return cls(
            tau_u[inverse],
            cost_u[inverse],
            slope_u[inverse],
            nv_u[inverse],
            np.array(masks)[inverse],
            np.array(hmasks)[inverse],
        )

    @property
    def shortest(self) -> FloatArray:
        """Each node's shortest duration (its first hull vertex)."""
        return self.tau[:, 0]

    @property
    def longest(self) -> FloatArray:
        """Each node's longest duration (its last hull vertex)."""
        return self.tau[np.arange(len(self.nv)), self.nv - 1]

    def under_estimate(
        self, floor: FloatArray, tolerance: float, min_vertices: int = THIN_MIN_VERTICES
    ) -> Relaxation:
        """Hulls with fewer pieces, each below the original by at most ``tolerance x floor[i]``.

        For the sweep; hulls of fewer than ``min_vertices`` vertices are kept.

        Each new hull is the maximum of a subset of the original segments' lines (those of the
        first and the last segment always), chosen greedily by :func:`thin_hull`. A convex
        function's segment lines lie below it, so the result is a convex, decreasing
        under-estimator, equal to the original at both ends of its domain: the relaxed
        frontier it gives is a lower bound on the original one (still certified), looser by
        at most ``tolerance x sum(floor)``, with fewer breakpoints. ``pareto`` and
        ``hull_mask`` are the original's (rounding uses the original hulls). ``tolerance ==
        0`` (or no hull long enough) returns ``self``. Cost ``O(H^2)`` per distinct hull.
        """
        if tolerance <= 0 or not (self.nv >= max(min_vertices, 3)).any():
            return self
        rows = np.concatenate(
            [self.tau, self.cost, self.nv[:, None].astype(np.float64), floor[:, None]], axis=1
        )
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        hulls = []
        for i in first:
            m = int(self.nv[i])
            t, c = self.tau[i, :m], self.cost[i, :m]
            if m >= max(min_vertices, 3):
                t, c = thin_hull(t, c, tolerance * float(floor[i]))
            hulls.append((t, c))
        tau_u, cost_u, slope_u, nv_u = _hull_table(hulls, self.tau.shape[1])
        return Relaxation(
            tau_u[inverse],
            cost_u[inverse],
            slope_u[inverse],
            nv_u[inverse],
            self.pareto,
            self.hull_mask,
        )


def thin_hull(tau: FloatArray, cost: FloatArray, tolerance: float) -> tuple[FloatArray, FloatArray]:
    """A convex piecewise-linear function with fewer pieces, below the one through ``(tau, cost)``.

    The given function has increasing ``tau`` and increasing slopes; the result is below it by
    at most ``tolerance`` anywhere on ``[tau[0], tau[-1]]``: the vertices ``(durations, costs)``
    of the maximum of some of its segments' lines.

    Greedy: from a kept segment ``k``, keep next the farthest segment ``k2`` whose line meets
    ``k``'s at most ``tolerance`` below the function (the largest difference between the
    function and the two lines lies at one of the original vertices between them or at where
    the lines cross); the first and the last segment are always kept, so both end points are
    exact, and so is every kept segment. Cost ``O(H^2)`` for ``H`` vertices.
    """
    m = len(tau)
    if m <= 2:
        return tau, cost
    sl = np.diff(cost) / np.diff(tau)
    off = cost[:-1] - sl * tau[:-1]  # line k: sl[k] * d + off[k]

    def cross(k: int, k2: int) -> float:
        return float((off[k] - off[k2]) / (sl[k2] - sl[k]))

    def error(k: int, k2: int) -> float:
        if not sl[k2] > sl[k]:
            return np.inf
        x = cross(k, k2)
        js = np.arange(k + 1, k2 + 1)
        below = cost[js] - np.maximum(sl[k] * tau[js] + off[k], sl[k2] * tau[js] + off[k2])
        at_x = float(np.interp(x, tau, cost)) - (sl[k] * x + off[k])
        return max(float(below.max()), at_x)

    kept = [0]
    k = 0
    while k < m - 2:
        k2 = k + 1
        while k2 + 1 <= m - 2 and error(k, k2 + 1) <= tolerance:
            k2 += 1
        kept.append(k2)
        k = k2
    ts = [float(tau[0])]
    cs = [float(cost[0])]
    for a, b in zip(kept[:-1], kept[1:], strict=True):
        x = min(max(cross(a, b), float(tau[a + 1])), float(tau[b]))
        ts.append(x)
        cs.append(min(sl[a] * x + off[a], sl[b] * x + off[b]))
    ts.append(float(tau[-1]))
    cs.append(float(cost[-1]))
    return np.array(ts), np.array(cs)


@dataclass(frozen=True)
class RelaxedStep:
    """One breakpoint of the relaxed frontier.

    Its iteration time, ``G(T)`` (sum of relaxed effective costs), the cut value (``-dG/dT``
    just below ``T``) and the durations.
    """

    time: float
    cost: float
    slope: float
    durations: FloatArray


def relaxed_frontier(
    problem: EnergyProblem,
    relaxation: Relaxation | None = None,
    *,
    cancel: Callable[[], bool] | None = None,
) -> Iterator[RelaxedStep]:
    """Yield the breakpoints of the relaxed frontier from the slowest to the fastest ``T``.

    Each step's ``slope`` is the marginal energy cost of shortening the iteration further
    (``inf`` at the fastest point). ``cancel`` is polled between chunks of steps; returning
    ``True`` raises :class:`~perseus.errors.SolverCancelled`. Every step carries its durations
    (``n`` floats): a caller that keeps them all holds ``O(n x steps)``;
    :func:`sweep_range` keeps a bounded number.
    """
    for chunk in _sweep(problem, relaxation or Relaxation.build(problem), 1, cancel):
        times, costs, slopes, _, durations, _ = chunk
        for i in range(len(times)):
            yield RelaxedStep(float(times[i]), float(costs[i]), float(slopes[i]), durations[i])


_Chunk = tuple[FloatArray, FloatArray, FloatArray, BoolArray, FloatArray, bool]


def _sweep(
    problem: EnergyProblem,
    rel: Relaxation,
    stride: int | Callable[[], int],
    cancel: Callable[[], bool] | None,
    cells: int = 0,
    start: FloatArray | None = None,
    t_stop: float | None = None,
) -> Iterator[_Chunk]:
    """The min-cut iteration in chunks of steps.

    Each chunk is ``(times, costs, slopes, kept, durations, done)``, ``durations`` holding the
    rows of the steps with ``kept`` set: every ``stride``-th step by index since the start
    (``stride`` read before each chunk), the first step in each of ``cells`` equal cells of time
    between the slowest and the fastest point, and the last step. ``start``: relaxed durations
    optimal at their own longest path to start from (default the longest durations); ``t_stop``:
    stop at the first step at or below it (default the fastest time).
    """
    dag = problem.dag
    d = rel.longest.copy() if start is None else np.array(start, dtype=np.float64)
    t_min = float(dag.iteration_time(rel.shortest)) if t_stop is None else float(t_stop)
    t_max = float(dag.iteration_time(d))
    scale = min(1e6, 2.0**52 / (np.abs(rel.slope).max(axis=1).sum() + 1.0))
    n = problem.num_nodes
    flows = (
        np.zeros(n, np.int64),
        np.zeros(len(dag.src), np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
    )
    kv = rel.nv - 1
    # the residual graph every step's network is laid out on, its capacities, search levels
    graph = split_graph(n, dag.src, dag.dst, np.diff(dag.pred_ptr) > 0, np.diff(dag.succ_ptr) > 0)
    layout: tuple[IntArray, ...] = (
        *graph,
        np.zeros(len(graph[1]), np.int64),
        np.empty(2 * n + 2, np.int64),
    )
    per_second = cells / (t_max - t_min) if cells > 0 and t_max > t_min else 0.0
    keep = np.array([0.0, 1.0, t_max, per_second, -1.0, np.inf])
    while True:
        if cancel is not None and cancel():
            raise SolverCancelled("frontier computation cancelled")
        keep[1] = stride() if callable(stride) else stride
        times, costs, slopes, kept, durations, d, done = relaxed_chunk(
            dag.topo, dag.pred_ptr, dag.pred_idx, dag.succ_ptr, dag.succ_idx, dag.src, dag.dst,
            rel.tau, rel.cost, rel.slope, rel.nv, rel.shortest, rel.longest,
            d, t_min, scale, _INT_INF, _STEPS_PER_CHUNK, *flows, kv, keep, *layout,
        )  # fmt: skip
        keep[0] += len(times)
        if done and not kept[-1]:  # the last step: the durations the sweep stopped at
            kept[-1] = True
            durations = np.concatenate([durations, d[None, :]])
        yield times, costs, slopes, kept, durations, done
        if done:
            return


def sweep_range(
    problem: EnergyProblem,
    swept: Relaxation,
    *,
    memory: int,
    cancel: Callable[[], bool] | None = None,
    progress: Callable[[float], None] | None = None,
    start: FloatArray | None = None,
    t_stop: float | None = None,
    on_chunk: Callable[[SweptSoFar], None] | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """The breakpoints of ``swept``'s relaxed frontier from ``start`` down to ``t_stop``.

    ``start`` defaults to the longest durations, ``t_stop`` to the fastest time. By increasing
    time: ``(times, costs, kept_times, kept_durations)``, the durations of about ``memory``
    bytes' worth kept as
    :meth:`~perseus.solver.breakpoints.RelaxedFrontier.sweep` says. ``on_chunk`` is called (on the
    sweeping thread) after every chunk of steps with what has been swept so far
    (:class:`SweptSoFar`): a reader may take the frontier above the sweep's position from it
    meanwhile (:mod:`perseus.solver.pipeline`).
    """
    n = problem.num_nodes
    budget = max(64, memory // (8 * max(n, 1)))
    cells = budget // 4
    cap = budget - cells
    stride = [1]
    by_index: dict[int, FloatArray] = {}
    by_time: dict[int, FloatArray] = {}
    times: list[FloatArray] = []
    costs: list[FloatArray] = []
    g = 0
    t_lo = float(problem.dag.iteration_time(swept.shortest)) if t_stop is None else t_stop
    t_hi = float(problem.dag.iteration_time(swept.longest if start is None else start))
    chunks = _sweep(problem, swept, lambda: stride[0], cancel, cells, start, t_stop)
    for t, c, _, kept, rows, done in chunks:
        st = stride[0]
        for r, j in enumerate(np.flatnonzero(kept)):
            last = done and j == len(t) - 1
            row = rows[r].copy()  # not a view: that would keep the whole chunk
            (by_index if (g + j) % st == 0 and not last else by_time)[g + int(j)] = row
        g += len(t)
        times.append(t)
        costs.append(c)
        while len(by_index) > cap:
            stride[0] *= 2
            by_index = {i: v for i, v in by_index.items() if i % stride[0] == 0}
        if on_chunk is not None:
            on_chunk(SweptSoFar(times, costs, by_index | by_time, bool(done)))
        if progress is not None and t_hi > t_lo:
            for x in np.minimum(1.0, (t_hi - t) / (t_hi - t_lo)):
                progress(float(x))
    kept_rows = by_index | by_time  # the slowest (index 0) and the last step among them
    order = sorted(kept_rows, reverse=True)  # by increasing time
    all_t = np.concatenate(times)
    return (
        all_t[::-1].copy(),
        np.concatenate(costs)[::-1].copy(),
        all_t[np.array(order)],
        np.stack([kept_rows[i] for i in order]),
    )


@dataclass(frozen=True, eq=False)
class SweptSoFar:
    """What a sweep has found when a chunk of its steps ends.

    Attributes:
        times, costs: the chunks' breakpoint times and ``G`` values, each chunk by decreasing
            time (the sweep's order); the lists are the sweep's own (read them on its thread).
        kept: the durations kept so far, by breakpoint index since the sweep began (each row
            is never changed; later chunks may drop rows from the sweep's own dictionaries).
        done: whether the sweep has ended.
    """

    times: list[FloatArray]
    costs: list[FloatArray]
    kept: dict[int, FloatArray]
    done: bool

    @property
    def position(self) -> float:
        """The time of the last breakpoint found (the sweep goes on below it)."""
        return float(self.times[-1][-1]) if self.times and len(self.times[-1]) else np.inf

    def arrays(
        self, lo: float, hi: float = np.inf
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """Every breakpoint so far, and the kept durations that span ``[lo, hi]``.

        By increasing time: ``(times, costs, kept_times, kept_durations)``, the kept rows from
        the last at or below ``lo`` to the first at or above ``hi`` (copied: memory in
        proportion to the window). ``kept_times[0] <= lo`` unless no row that fast is kept yet.
        """
        all_t = np.concatenate(self.times)[::-1].copy()
        all_c = np.concatenate(self.costs)[::-1].copy()
        last = len(all_t) - 1
        order = sorted(self.kept, reverse=True)  # by increasing time
        kt = np.array([all_t[last - i] for i in order])
        first = max(0, int(np.searchsorted(kt, lo, side="right")) - 1)
        end = min(len(kt), int(np.searchsorted(kt, hi, side="left")) + 1)
        rows = [self.kept[i] for i in order[first:end]]
        return all_t, all_c, kt[first:end], np.stack(rows)


def path_bound(
    problem: EnergyProblem, relaxation: Relaxation, deadline: float
) -> tuple[float, float]:
    """A certified lower bound on ``G`` that needs no sweep.

    Returns ``(a, F)`` with ``G(T) >= a - F T`` for every ``T``, tightest at ``deadline``.

    Lagrangian duality: for any flow ``f`` through the DAG of value ``F`` (node throughputs
    ``f_i``), every schedule within ``T`` has ``sum_i f_i d_i <= F T`` (decompose ``f`` into
    paths, each no longer than ``T``), so ``G(T) >= sum_i min_d (c_i(d) + f_i d) - F T``. Here
    ``f`` is ``phi`` along one longest path of the shortest durations (a critical path at the
    fastest time), ``phi`` maximising the bound at ``deadline`` (a concave function of ``phi``,
    by golden-section search). Cost ``O(n H)`` per evaluation, a few dozen evaluations.
    """
    dag = problem.dag
    d = relaxation.shortest
    es = np.asarray(dag.earliest_start(d), dtype=np.float64)
    fin = es + d
    v = int(np.argmax(fin))
    path = [v]
    tol = 1e-12 * max(float(fin[v]), 1.0)
    while es[v] > tol:
        preds = dag.pred_idx[dag.pred_ptr[v] : dag.pred_ptr[v + 1]]
        v = int(preds[np.argmax(fin[preds])])
        path.append(v)
    on = np.zeros(problem.num_nodes, dtype=bool)
    on[path] = True
    rel = relaxation
    valid = np.arange(rel.tau.shape[1])[None, :] < rel.nv[:, None]
    base = float(np.where(valid, rel.cost, np.inf).min(axis=1)[~on].sum())
    tau = np.where(valid[on], rel.tau[on], 0.0)
    cost = np.where(valid[on], rel.cost[on], np.inf)

    def q(phi: float) -> float:
        return base + float((cost + phi * tau).min(axis=1).sum()) - phi * deadline

    lo, hi = 0.0, float(np.abs(rel.slope[on]).max()) + 1.0
    g = (np.sqrt(5.0) - 1) / 2
    for _ in range(60):
        a_, b_ = hi - g * (hi - lo), lo + g * (hi - lo)
        if q(a_) < q(b_):
            lo = a_
        else:
            hi = b_
    phi = max(0.0, (lo + hi) / 2)
    if q(phi) < q(0.0):
        phi = 0.0
    return q(phi) + phi * deadline, phi


def _hull_table(
    hulls: list[tuple[FloatArray, FloatArray]], width: int
) -> tuple[FloatArray, FloatArray, FloatArray, IntArray]:
    """Hull vertices padded to ``width`` columns.

    Returns times (``inf`` past the last vertex), costs (the last one repeated), segment slopes,
    and each hull's vertex count.
    """
    tau = np.full((len(hulls), width), np.inf)
    cost = np.zeros((len(hulls), width))
    slope = np.zeros((len(hulls), max(width - 1, 1)))
    nv = np.empty(len(hulls), dtype=np.int64)
    for r, (t, c) in enumerate(hulls):
        tau[r, : len(t)] = t
        cost[r, : len(t)] = c
        cost[r, len(t) :] = c[-1]
        if len(t) > 1:
            slope[r, : len(t) - 1] = np.diff(c) / np.diff(t)
        nv[r] = len(t)
    return tau, cost, slope, nv
