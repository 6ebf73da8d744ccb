"""The iteration time-energy frontier by iterative min-cut (Phillips-Dessouky with exact steps).

Problem. Every DAG node ``i`` (one instruction) runs at one of its measured frequencies; option
``j`` takes ``t_ij`` seconds and ``e_ij`` joules. For an iteration time ``T`` on ``R`` GPUs the
energy of a plan is ``sum_i e_i + P (R T - sum_i t_i)`` (``P``: blocking power), i.e.
``P R T + sum_i c_i`` with the *effective* cost ``c = e - P t``. The frontier is, for every ``T``
between the fastest and the cheapest plan, the plan of least energy finishing within ``T``.

Relaxation. Each node's Pareto-optimal options in (time, effective cost) are replaced by the lower
convex hull of those points, a convex, decreasing, piecewise-linear cost ``c_i(d)`` of a continuous
duration ``d``. Minimising ``sum_i c_i(d_i)`` subject to the longest path being at most ``T`` is a
linear program (the project time-cost trade-off problem) whose optimum ``G(T)`` is convex and
piecewise linear in ``T``; ``G(T) + P R T`` is a certified lower bound on the energy of any
discrete plan within ``T``.

Algorithm. Starting from the longest durations (the optimum for every ``T`` at or above their
longest path), the iteration time is shortened along the exact relaxed frontier, as in
Phillips & Dessouky (1977, "Solving the project time/cost tradeoff problem using the minimal cut
concept", Management Science 24(4)) and Fulkerson (1961, "A network flow computation for project
cost curves"): on the subgraph of critical nodes, a minimum *s-t* cut picks the nodes to shorten
(forward arcs, capacity = marginal cost of shortening) and the nodes that may be lengthened back
(backward arcs, lower bound = marginal saving of lengthening). The cut's value is the slope of
``G``. Unlike a fixed time quantum, each step moves by the exact distance to the next event: a
shortened or lengthened node reaching a hull vertex, or a non-critical path becoming critical
(found by a Newton iteration on the longest path, which is convex in the step). So the number of
max-flows equals the number of breakpoints of ``G``, not of time quanta, and the relaxed frontier
is exact up to floating point.

Max-flow with lower bounds is solved with two ``scipy.sparse.csgraph.maximum_flow`` (Dinic) calls
on integer-scaled capacities: a feasible circulation, then an augmenting max-flow in its residual.

Discrete plans. At every breakpoint the continuous durations are rounded to real, measured
options: each node takes its slowest Pareto option no longer than its relaxed duration (so the
plan still meets ``T``), then slack is reclaimed by alternately slowing nodes into their free
float in the earliest- and latest-start schedules. Every candidate is re-evaluated exactly from
the measurements and the Pareto set of (time, energy) is kept; each point reports the relaxed
bound ``G(T) + P R T`` at its own time.

Complexity: one step costs two max-flows on at most ``2n + 4`` vertices plus ``O(levels)``
vectorised passes over the DAG, where ``levels`` is the longest chain of instructions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus import _kernels as K
from perseus.errors import SolverCancelled
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, lower_hull_indices, pareto_indices
from perseus.schedules import Schedule

__all__ = [
    "solve_frontier",
    "solve_problem",
    "relaxed_frontier",
    "round_plan",
    "RelaxedStep",
    "Relaxation",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_INT_INF = 1 << 60  # "infinite" capacity; all finite capacities together stay below 2**52


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
        width = max(len(t) for t, _ in hulls)
        tau_u = np.full((len(hulls), width), np.inf)
        cost_u = np.zeros((len(hulls), width))
        slope_u = np.zeros((len(hulls), max(width - 1, 1)))
        nv_u = np.empty(len(hulls), dtype=np.int64)
        for r, (t, c) in enumerate(hulls):
            tau_u[r, : len(t)] = t
            cost_u[r, : len(t)] = c
            cost_u[r, len(t) :] = c[-1]
            if len(t) > 1:
                slope_u[r, : len(t) - 1] = np.diff(c) / np.diff(t)
            nv_u[r] = len(t)
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
        return self.tau[:, 0]

    @property
    def longest(self) -> FloatArray:
        return self.tau[np.arange(len(self.nv)), self.nv - 1]

    def locate(self, d: FloatArray) -> tuple[IntArray, BoolArray]:
        """Index of the hull vertex at or below ``d`` and whether ``d`` sits on it."""
        tol = 1e-12 * np.maximum(1.0, np.abs(d))
        k = (self.tau <= (d + tol)[:, None]).sum(axis=1) - 1
        k = np.clip(k, 0, self.nv - 1)
        rows = np.arange(len(d))
        on = np.abs(d - self.tau[rows, k]) <= tol
        return k, on

    def costs(self, d: FloatArray) -> FloatArray:
        """Relaxed effective cost of each node at duration ``d``."""
        k, _ = self.locate(d)
        rows = np.arange(len(d))
        seg = np.minimum(k, self.slope.shape[1] - 1)
        slope = np.where(k < self.nv - 1, self.slope[rows, seg], 0.0)
        return self.cost[rows, k] + slope * (d - self.tau[rows, k])


@dataclass(frozen=True)
class RelaxedStep:
    """One breakpoint of the relaxed frontier: iteration time, ``G(T)`` (sum of relaxed
    effective costs), the cut value (``-dG/dT`` just below ``T``) and the durations."""

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
    (``inf`` at the fastest point).
    """
    rel = relaxation or Relaxation.build(problem)
    dag = problem.dag
    topo, pp, pi, sp_, si = dag.topo, dag.pred_ptr, dag.pred_idx, dag.succ_ptr, dag.succ_idx
    n = problem.num_nodes
    rows = np.arange(n)
    d = rel.longest.copy()
    t_min = float(K.earliest_start(topo, pp, pi, rel.shortest).__add__(rel.shortest).max())
    scale = min(1e6, 2.0**52 / (np.abs(rel.slope).max(axis=1).sum() + 1.0))
    src, dst = dag.src, dag.dst
    is_source = np.zeros(n, dtype=bool)
    is_source[dag.topo] = pp[dag.topo + 1] == pp[dag.topo]
    while True:
        if cancel is not None and cancel():
            raise SolverCancelled("frontier computation cancelled")
        es = K.earliest_start(topo, pp, pi, d)
        ef = es + d
        T = float(ef.max())
        tol = 1e-9 * max(T, 1e-9)
        k, on = rel.locate(d)
        d = np.where(on, rel.tau[rows, k], d)  # snap onto vertices
        g = float(rel.costs(d).sum())
        last = k >= rel.nv - 1
        seg_hi = np.minimum(k, rel.slope.shape[1] - 1)
        seg_lo = np.maximum(k - 1, 0)
        # marginal cost of shortening (left slope) and saving of lengthening (right slope)
        u = np.where(
            on, np.where(k == 0, np.inf, -rel.slope[rows, seg_lo]), -rel.slope[rows, seg_hi]
        )
        lo = np.where(on & last, 0.0, -rel.slope[rows, seg_hi])
        if T <= t_min + tol:
            yield RelaxedStep(T, g, float("inf"), d.copy())
            return
        lf = K.latest_finish(topo, sp_, si, d, T)
        crit_mask = lf - ef <= tol
        tight = crit_mask[src] & crit_mask[dst] & (ef[src] >= es[dst] - tol)
        crit = np.flatnonzero(crit_mask)
        m = len(crit)
        local = np.full(n, -1, dtype=np.int64)
        local[crit] = np.arange(m)
        sources = local[crit[es[crit] <= tol]]
        sinks = local[crit[ef[crit] >= T - tol]]
        s_node, t_node = 2 * m, 2 * m + 1
        ihi = np.where(np.isfinite(u[crit]), np.ceil(np.minimum(u[crit], 1e300) * scale), _INT_INF)
        ihi = np.minimum(ihi, _INT_INF).astype(np.int64)
        ilo = np.minimum(np.floor(lo[crit] * scale).astype(np.int64), ihi)
        ne = int(tight.sum())
        loc = np.arange(m, dtype=np.int64)
        tail = np.concatenate(
            [2 * loc, 2 * local[src[tight]] + 1, np.full(len(sources), s_node), 2 * sinks + 1]
        )
        head = np.concatenate(
            [2 * loc + 1, 2 * local[dst[tight]], 2 * sources, np.full(len(sinks), t_node)]
        )
        lo_a = np.concatenate([ilo, np.zeros(ne + len(sources) + len(sinks), np.int64)])
        hi_a = np.concatenate([ihi, np.full(ne + len(sources) + len(sinks), _INT_INF, np.int64)])
        status, side = K.min_cut_lower_bounds(
            2 * m + 2, tail, head, lo_a, hi_a, s_node, t_node, _INT_INF
        )
        if status == 2:  # numerically infeasible lower bounds: no lengthening this step
            status, side = K.min_cut_lower_bounds(
                2 * m + 2, tail, head, np.zeros_like(lo_a), hi_a, s_node, t_node, _INT_INF
            )
        if status == 1:
            yield RelaxedStep(T, g, float("inf"), d.copy())
            return
        sh = crit[side[2 * loc] & ~side[2 * loc + 1]]
        ln = crit[~side[2 * loc] & side[2 * loc + 1]]
        value = float(u[sh].sum() - lo[ln].sum())
        yield RelaxedStep(T, g, value, d.copy())
        a = np.zeros(n)
        a[sh] = 1.0
        a[ln] = -1.0
        # distance to the next hull vertex for every moving node
        room_sh = d[sh] - np.where(
            on[sh], rel.tau[sh, np.maximum(k[sh] - 1, 0)], rel.tau[sh, k[sh]]
        )
        room_ln = rel.tau[ln, np.minimum(k[ln] + 1, rel.nv[ln] - 1)] - d[ln]
        delta = float(min(room_sh.min(initial=np.inf), room_ln.min(initial=np.inf)))
        if not np.isfinite(delta) or delta <= 0:
            raise RuntimeError("min-cut step found no room to move; the relaxation is degenerate")
        # Shrink delta until no other path exceeds the new iteration time (Newton on the convex
        # longest-path function of the step).
        for _ in range(10_000):
            ef2, ka = K.earliest_start_k(topo, pp, pi, d - a * delta, a, tol)
            j = int(np.argmax(ef2))
            excess = ef2[j] - (T - delta)
            if excess <= tol:
                break
            slope = 1.0 - ka[j]
            if slope <= 0:
                break
            delta -= excess / slope
        d = np.clip(d - a * delta, rel.shortest, rel.longest)


class _Rounder:
    """Rounds relaxed durations to a measured plan within a deadline (see the module docstring)."""

    def __init__(
        self, problem: EnergyProblem, rel: Relaxation, levels: int = 12, max_rounds: int = 8
    ) -> None:
        times = np.where(rel.pareto, problem.times, np.inf)
        self.order = np.argsort(times, axis=1, kind="stable").astype(np.int64)
        self.nopt = rel.pareto.sum(axis=1).astype(np.int64)
        self.costs = problem.energies - problem.blocking_power * problem.times
        self.problem = problem
        self.hull = rel.hull_mask
        self.levels = levels
        self.max_rounds = max_rounds

    def __call__(
        self, durations: FloatArray, deadline: float, jump: bool = True
    ) -> npt.NDArray[np.uint8]:
        dag = self.problem.dag
        plan: npt.NDArray[np.uint8] = K.round_and_reclaim(
            dag.topo, dag.pred_ptr, dag.pred_idx, dag.succ_ptr, dag.succ_idx,
            self.problem.times, self.costs, self.hull, self.order, self.nopt,
            np.asarray(durations, dtype=np.float64), float(deadline), self.levels, jump, self.max_rounds,
        )  # fmt: skip
        return plan


def round_plan(
    problem: EnergyProblem, rel: Relaxation, durations: FloatArray, deadline: float
) -> npt.NDArray[np.uint8]:
    """A measured plan within ``deadline`` from relaxed ``durations`` (see the module docstring)."""
    return _Rounder(problem, rel)(durations, deadline)


def solve_problem(
    problem: EnergyProblem,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    max_candidates: int = 1500,
) -> Frontier:
    """Compute the frontier of an :class:`EnergyProblem` (see the module docstring).

    ``max_candidates`` caps how many relaxed points (breakpoints and the midpoints between
    them) are rounded to measured plans; each is rounded twice (slack handed out in jumps and
    one option at a time) and the Pareto set of all results is kept.
    """
    rel = Relaxation.build(problem)
    dag = problem.dag
    t_min = float(dag.iteration_time(rel.shortest))
    t_max = float(dag.iteration_time(rel.longest))
    steps: list[RelaxedStep] = []
    for step in relaxed_frontier(problem, rel, cancel=cancel):
        steps.append(step)
        if progress is not None and t_max > t_min:
            progress(0.9 * min(1.0, (t_max - step.time) / (t_max - t_min)))
    steps.reverse()  # by increasing time
    bp_t = np.array([s.time for s in steps])
    bp_g = np.array([s.cost for s in steps])
    cand_d = [s.durations for s in steps]
    cand_T = list(bp_t)
    # midpoints between breakpoints give plans for deadlines between them
    for a, b in zip(steps[:-1], steps[1:], strict=True):
        cand_d.append(0.5 * (a.durations + b.durations))
        cand_T.append(0.5 * (a.time + b.time))
    # Round at most `max_candidates` of them, evenly by index (breakpoints crowd where the
    # frontier bends, so this keeps candidates dense where they matter).
    if len(cand_T) > max_candidates:
        by_time = np.argsort(cand_T, kind="stable")
        pick = by_time[
            np.unique(np.linspace(0, len(cand_T) - 1, max_candidates).round().astype(int))
        ]
        cand_d = [cand_d[i] for i in pick]
        cand_T = [cand_T[i] for i in pick]
    rounder = _Rounder(problem, rel)
    plans = [problem.max_frequency_plan()]
    for i, (d, T) in enumerate(zip(cand_d, cand_T, strict=True)):
        if i % 64 == 0:
            if cancel is not None and cancel():
                raise SolverCancelled("frontier computation cancelled")
            if progress is not None:
                progress(0.9 + 0.1 * i / len(cand_d))
        plans.append(rounder(d, T, True))
        plans.append(rounder(d, T, False))
    allp = np.stack(plans)
    allp = np.unique(allp, axis=0)
    times, energies = problem.evaluate_many(allp)
    # Pareto filter on (time, energy - P R time): a plan survives unless another one is at
    # least as fast and uses no more energy at every deadline it meets (waiting included).
    waiting = energies - problem.blocking_power * dag.num_ranks * times
    keep = []
    best = np.inf
    for i in np.lexsort((waiting, times)):
        if waiting[i] < best - 1e-9 * abs(waiting[i]):
            keep.append(i)
            best = waiting[i]
    keep_a = np.array(keep)
    fastest = problem.evaluate(problem.max_frequency_plan())
    ft = times[keep_a]
    lb = np.interp(ft, bp_t, bp_g) + problem.blocking_power * dag.num_ranks * ft
    # The slowest plan meets its bound exactly; don't let float rounding put the bound above it.
    fe = energies[keep_a]
    lb = np.where((lb > fe) & (lb - fe <= 1e-9 * np.abs(fe)), fe, lb)
    if progress is not None:
        progress(1.0)
    return Frontier(
        schedule=dag.schedule,
        blocking_power=problem.blocking_power,
        max_frequency_time=fastest.time,
        max_frequency_energy=fastest.energy,
        times=ft,
        energies=energies[keep_a],
        lower_bounds=lb,
        plans=allp[keep_a],
        node_freqs=problem.freqs,
        bound_times=bp_t,
        bound_energies=bp_g + problem.blocking_power * dag.num_ranks * bp_t,
    )


def solve_frontier(
    profile: Profile,
    schedule: Schedule,
    blocking_power: float,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Frontier:
    """The time-energy frontier of ``schedule`` on ``profile`` (see the module docstring).

    Args:
        profile: measured per-stage profile.
        schedule: the pipeline's per-rank instruction order.
        blocking_power: watts a GPU draws while waiting on the pipeline.
        progress: called with the fraction done (0..1) now and then.
        cancel: polled between steps; returning ``True`` raises :class:`SolverCancelled`.
    """
    problem = EnergyProblem.build(profile, schedule, blocking_power)
    return solve_problem(problem, progress=progress, cancel=cancel)
