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

Max-flow with lower bounds runs on integer-scaled capacities (Dinic, ``perseus._kernels``): the
previous step's maximum flow is the starting point, its imbalances and violated lower bounds are
repaired through a helper source and sink, then it is augmented to a maximum flow; the source side
of the final residual graph is the minimum cut. Between breakpoints only a few bounds change, so
little is left to augment.

Discrete plans. Relaxed solutions are rounded to real, measured options: a topological sweep
puts each node on the nearer of the two hull vertices around its relaxed duration when that
still fits (time saved by rounding down is carried to later nodes, so the plan still meets
``T``), then slack is reclaimed by slowing nodes into the idle gaps of the earliest- and
latest-start schedules, steepest savings first. Candidates are breakpoints spread over the
frontier, then, for a few refinement rounds, the relaxed optimum in the middle of the intervals
between found plans where the gap to the bound peaks highest, and those intervals' own plans
given the slack up to there. Where the gap stays high, randomised roundings (each node rounded up
past a random fraction of the way to the slower vertex) and *diagonal* roundings search further.
A diagonal rounding gives every instruction of one microbatch and kind the same threshold, on
every stage, and spreads the thresholds of successive microbatches evenly (golden-ratio steps
from a random start): it mixes the two hull vertices around the relaxed durations the way the
relaxation mixes them, by whole microbatches travelling through the pipeline, so that the ranks'
delays line up by microbatch rather than add up independently along paths that zigzag between
ranks (it lowers the worst gaps measurably, but does not remove that loss: see the README). Then
a local search of exchanges (speed one node up by one option, hand the float that
frees to the moves that save most; keep it if it saves overall) polishes a few plans. The
zero-slowdown plan, if still that far from the bound, gets a large-neighbourhood search (ruin
and recreate: slow instructions down, on one rank, in a band across the pipeline or along one
microbatch's pass through the stages, and repair the overrun along the longest path; or speed
some up; then reclaim the slack, keeping the result if it saves energy). Every candidate is
re-evaluated exactly from the measurements and the Pareto set of (time, energy with waiting)
is kept; each point reports the relaxed bound ``G(T) + P R T`` at its own time.

Complexity: one step costs a warm-started max-flow on at most ``2n + 4`` vertices and a few
``O(n + edges)`` longest-path passes; one rounding costs ``O(levels x (n + edges))``, one pass of
exchanges ``O(n x (n + edges))`` (so only a few plans get them), one search trial a rounding's
cost plus, when it slows instructions down, a longest-path pass per instruction it speeds up
to repair the overrun. All of it is compiled (numba, cached on disk); Python only orchestrates
chunks of steps and batches of candidates.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus import _kernels as K
from perseus.errors import OptionError, SolverCancelled
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, lower_hull_indices, pareto_indices
from perseus.schedules import Schedule

__all__ = [
    "solve_frontier",
    "solve_problem",
    "relaxed_frontier",
    "RelaxedStep",
    "Relaxation",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_INT_INF = 1 << 60  # "infinite" capacity; all finite capacities together stay below 2**52
#: Independent searches of the zero-slowdown plan with ``effort > 0`` (a fixed number, so the
#: result does not depend on the machine's cores).
SEARCH_STARTS = 2


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
    d = rel.longest.copy()
    t_min = float(dag.iteration_time(rel.shortest))
    scale = min(1e6, 2.0**52 / (np.abs(rel.slope).max(axis=1).sum() + 1.0))
    n = problem.num_nodes
    flows = (
        np.zeros(n, np.int64),
        np.zeros(len(dag.src), np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
    )
    while True:
        if cancel is not None and cancel():
            raise SolverCancelled("frontier computation cancelled")
        times, costs, slopes, durations, d, done = K.relaxed_chunk(
            dag.topo, dag.pred_ptr, dag.pred_idx, dag.succ_ptr, dag.succ_idx, dag.src, dag.dst,
            rel.tau, rel.cost, rel.slope, rel.nv, rel.shortest, rel.longest,
            d, t_min, scale, _INT_INF, 64, *flows,
        )  # fmt: skip
        for i in range(len(times)):
            yield RelaxedStep(float(times[i]), float(costs[i]), float(slopes[i]), durations[i])
        if done:
            return


class _Rounder:
    """Rounds relaxed durations to measured plans within deadlines, and reclaims the slack of
    existing plans (see the module docstring). Works on batches, split over a thread pool (the
    kernels release the GIL)."""

    def __init__(
        self,
        problem: EnergyProblem,
        rel: Relaxation,
        levels: int = 12,
        decay: float = 0.7,
        max_rounds: int = 8,
        exchange_passes: int = 0,
        free_levels: int = 2,
        free_decay: float = 0.2,
    ) -> None:
        times = np.where(rel.pareto, problem.times, np.inf)
        order = np.argsort(times, axis=1, kind="stable")
        costs = problem.energies - problem.blocking_power * problem.times
        # Each node's Pareto options by increasing time, with their costs and hull flags
        # (entries past nopt are padding and never read).
        self.order = order.astype(np.int64)
        self.nopt = rel.pareto.sum(axis=1).astype(np.int64)
        self.times = np.ascontiguousarray(np.take_along_axis(problem.times, order, axis=1))
        self.costs = np.ascontiguousarray(np.take_along_axis(costs, order, axis=1))
        self.hull = np.ascontiguousarray(np.take_along_axis(rel.hull_mask, order, axis=1))
        # position of each Pareto option in that order (-1: dominated)
        self.position = np.full(order.shape, -1, dtype=np.int64)
        cols = np.arange(order.shape[1])[None, :]
        np.put_along_axis(self.position, order, np.where(cols < self.nopt[:, None], cols, -1), 1)
        self.problem = problem
        self.levels = levels
        self.max_rounds = max_rounds
        self.decay = decay
        self.exchange_passes = exchange_passes
        self.free_levels = free_levels
        self.free_decay = free_decay
        d = problem.dag
        self.dag = (d.topo, d.pred_ptr, d.pred_idx, d.succ_ptr, d.succ_idx)
        # nodes are numbered rank by rank: where each rank's run starts
        self.rank_ptr = np.searchsorted(d.rank, np.arange(d.num_ranks + 1)).astype(np.int64)
        # the node of each (stage, kind, microbatch), -1 where there is none
        diag = np.full(
            (int(d.stage.max()) + 1, int(d.kind.max()) + 1, int(d.microbatch.max()) + 1), -1
        )
        diag[d.stage, d.kind, d.microbatch] = np.arange(len(d.stage))
        self.diag = diag.astype(np.int64)

    def _options(self, picks: IntArray) -> npt.NDArray[np.uint8]:
        return self.order[np.arange(picks.shape[1])[None, :], picks].astype(np.uint8)

    def _improve(
        self,
        plans: npt.NDArray[np.uint8],
        kernel: Callable[[IntArray, BoolArray], IntArray],
    ) -> npt.NDArray[np.uint8]:
        """``plans`` (option indices) passed to ``kernel`` as positions in the sorted options,
        with the mask of the rows it gets; rows using a dominated option come back unchanged."""
        picks = self.position[np.arange(plans.shape[1])[None, :], plans]
        ok: BoolArray = np.asarray((picks >= 0).all(axis=1))
        out = plans.copy()
        if ok.any():
            out[ok] = self._options(kernel(picks[ok], ok))
        return out

    def round(
        self,
        durations: FloatArray,
        deadlines: FloatArray,
        jumps: BoolArray,
        up_at: FloatArray | None = None,
    ) -> npt.NDArray[np.uint8]:
        """Plans (option indices, ``(k, n)``) for rows of relaxed ``durations``.

        A node whose relaxed duration lies between two hull vertices goes to the slower one
        when it fits and the duration is past ``up_at`` (default one half) of the way there.
        """
        durations = np.ascontiguousarray(durations, dtype=np.float64)
        if up_at is None:
            up_at = np.full(durations.shape, 0.5)
        picks = K.round_and_reclaim(
            self.dag, self.times, self.costs, self.hull, self.nopt, durations,
            np.asarray(deadlines, dtype=np.float64), np.ascontiguousarray(up_at, dtype=np.float64),
            np.asarray(jumps, dtype=np.bool_),
            self.levels, self.decay, self.free_levels, self.free_decay, self.max_rounds,
            self.exchange_passes,
        )  # fmt: skip
        return self._options(picks)

    def reclaim(
        self,
        plans: npt.NDArray[np.uint8],
        deadlines: FloatArray,
        exchange_passes: int | None = None,
    ) -> npt.NDArray[np.uint8]:
        """``plans`` (option indices) each given the slack up to its deadline, then improved by
        ``exchange_passes`` passes of exchanges (default: the rounder's, none unless set).
        Plans using a dominated option are returned unchanged."""
        passes = self.exchange_passes if exchange_passes is None else exchange_passes
        return self._improve(
            plans,
            lambda picks, ok: K.reclaim_plans(
                self.dag, self.times, self.costs, self.nopt, picks,
                np.asarray(deadlines, dtype=np.float64)[ok],
                self.levels, self.decay, self.max_rounds, passes,
            ),
        )  # fmt: skip

    def exchange(
        self, plans: npt.NDArray[np.uint8], deadlines: FloatArray, passes: int = 2
    ) -> npt.NDArray[np.uint8]:
        """``plans`` given the slack up to their deadlines, then improved by up to ``passes``
        passes of exchanges within them."""
        return self.reclaim(plans, deadlines, exchange_passes=passes)

    def search(
        self, plans: npt.NDArray[np.uint8], deadlines: FloatArray, seeds: IntArray, iters: int
    ) -> npt.NDArray[np.uint8]:
        """``plans`` given the slack up to their deadlines, then improved by ``iters`` trials of
        a large-neighbourhood search each (seeded by ``seeds``). Plans using a dominated option
        are returned unchanged."""
        return self._improve(
            plans,
            lambda picks, ok: K.search_plans(
                self.dag, self.times, self.costs, self.nopt, self.hull, self.rank_ptr, self.diag, picks,
                np.asarray(deadlines, dtype=np.float64)[ok], iters,
                np.asarray(seeds, dtype=np.int64)[ok], self.levels, self.decay,
            ),
        )  # fmt: skip

    def __call__(
        self, durations: FloatArray, deadline: float, jump: bool = True
    ) -> npt.NDArray[np.uint8]:
        """One plan for relaxed ``durations`` within ``deadline``."""
        return self.round(np.asarray(durations)[None, :], np.array([deadline]), np.array([jump]))[0]


def _pareto(times: FloatArray, waiting: FloatArray) -> IntArray:
    """Indices, by increasing time, of the points with strictly decreasing ``waiting``."""
    keep = []
    best = np.inf
    for i in np.lexsort((waiting, times)):
        if waiting[i] < best - 1e-9 * abs(waiting[i]):
            keep.append(i)
            best = waiting[i]
    return np.asarray(keep, dtype=np.int64)


def solve_problem(
    problem: EnergyProblem,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    initial_candidates: int = 192,
    refine_rounds: int = 5,
    refine_batch: int = 64,
    target_gap: float = 2e-4,
    hard_gap: float = 2.5e-3,
    hard_rounds: int = 3,
    hard_intervals: int = 8,
    random_trials: int = 24,
    polish_plans: int = 16,
    polish_nodes: int = 4096,
    effort: float = 1.0,
    search_work: int = 400_000,
    search_intervals: int = 16,
    diagonal_rounding: bool = True,
    seed: int = 0,
    rounding: dict[str, Any] | None = None,
) -> Frontier:
    """Compute the frontier of an :class:`EnergyProblem` (see the module docstring).

    Discrete plans come from rounding relaxed solutions: first ``initial_candidates`` relaxed
    breakpoints spread evenly by index (breakpoints crowd where the frontier bends), then up to
    ``refine_rounds`` refinement rounds. Between two consecutive plans of the frontier the gap
    to the bound peaks just before the second one's time (the first plan plus waiting is still
    the best there); each round takes the ``refine_batch`` intervals with the highest peaks
    (above ``target_gap``) and, at each one's middle, rounds the relaxed optimum and gives the
    interval's own plan the slack up to it; where the peak is above ``hard_gap``, it also
    rounds there diagonally (``diagonal_rounding``, see the module docstring). Rounds stop once
    one no longer lowers the mean gap by 1 %.

    Intervals still peaking above ``hard_gap`` then get more effort: up to ``hard_rounds``
    times, ``random_trials`` randomised roundings in the middle of each of the
    ``hard_intervals`` worst, every other one diagonal (reproducible from ``seed``). On A40
    8 stages x 12 / 24 / 96 microbatches the diagonal roundings lower the worst gap from T0 to
    1.5 T0 from 0.63 / 0.73 / 0.87 % to 0.56 / 0.68 / 0.77 %.

    Then, when the fastest plan's own gap is above ``hard_gap`` too, that plan (the
    zero-slowdown one, what a pipeline without stragglers runs) gets a large-neighbourhood
    search within its own time: :data:`SEARCH_STARTS` independently seeded searches of
    ``effort * search_work // n`` trials each. Each whole unit of ``effort`` past 1 adds a round
    of searches (``search_work // n`` trials each) on the ``search_intervals`` intervals with
    the highest peaks above ``hard_gap``: each from the interval's plan given the slack up to
    the interval's middle, so that a good plan there splits the interval where its own plan
    plus waiting is overtaken by the bound. ``effort=0`` skips all searching. On this
    machine's two cores, the default's searching costs about 0.1 s for 192 instructions (the
    whole A40 8x12 solve about 0.35 s); each further unit about 2 s.

    Last, the plans of the ``polish_plans`` intervals with the highest peaks above ``hard_gap``
    are improved by exchanges (speed one node up to let others slow down) within their own time
    and within the interval's end. A pass of exchanges costs ``O(n^2)``, so at most
    ``polish_nodes // n`` plans are polished (at least one). The Pareto set of everything found
    is kept. Everything stays reproducible from ``seed``.
    """
    if not (np.isfinite(effort) and effort >= 0):
        raise OptionError(f"effort: must be a finite number >= 0, got {effort!r}")
    rel = Relaxation.build(problem)
    dag = problem.dag
    pr = problem.blocking_power * dag.num_ranks
    t_min = float(dag.iteration_time(rel.shortest))
    t_max = float(dag.iteration_time(rel.longest))
    steps: list[RelaxedStep] = []
    for step in relaxed_frontier(problem, rel, cancel=cancel):
        steps.append(step)
        if progress is not None and t_max > t_min:
            progress(0.6 * min(1.0, (t_max - step.time) / (t_max - t_min)))
    steps.reverse()  # by increasing time
    bp_t = np.array([s.time for s in steps])
    bp_g = np.array([s.cost for s in steps])
    bp_d = np.stack([s.durations for s in steps])

    def relaxed_at(deadlines: FloatArray) -> FloatArray:
        # Between breakpoints the relaxed optimum moves linearly.
        j = np.clip(np.searchsorted(bp_t, deadlines, side="right") - 1, 0, len(bp_t) - 1)
        k = np.minimum(j + 1, len(bp_t) - 1)
        span = bp_t[k] - bp_t[j]
        w = np.where(span > 0, (deadlines - bp_t[j]) / np.where(span > 0, span, 1.0), 0.0)
        w = np.clip(w, 0.0, 1.0)[:, None]
        return (1 - w) * bp_d[j] + w * bp_d[k]

    rounder = _Rounder(problem, rel, **(rounding or {}))
    golden = (np.sqrt(5.0) - 1) / 2

    def diagonal_up_at(offsets: FloatArray) -> FloatArray:
        """Rounding thresholds (one row per offset) shared by a microbatch's instructions of
        one kind on every stage; successive microbatches' thresholds a golden-ratio step apart
        (evenly spread for any run of them), each kind's half a turn from the forwards'."""
        return (dag.microbatch[None, :] * golden + 0.5 * dag.kind[None, :] + offsets[:, None]) % 1.0

    rng = np.random.default_rng(seed)
    # every distinct plan found, with its true time and energy
    seen: set[bytes] = set()
    found: list[npt.NDArray[np.uint8]] = []
    found_t: list[FloatArray] = []
    found_e: list[FloatArray] = []

    def add(plans: npt.NDArray[np.uint8]) -> None:
        fresh = []
        for plan in plans:
            key = plan.tobytes()
            if key not in seen:
                seen.add(key)
                fresh.append(plan)
        if fresh:
            new = np.stack(fresh)
            t, e = problem.evaluate_many(new)
            found.append(new)
            found_t.append(t)
            found_e.append(e)

    add(problem.max_frequency_plan()[None, :])
    threads = max(1, min(8, os.cpu_count() or 1))
    # The kernels release the GIL: split each batch over every core.
    with ThreadPoolExecutor(max_workers=threads) as pool:

        def batched(fn: Callable[..., npt.NDArray[np.uint8]], *arrays: Any) -> None:
            if cancel is not None and cancel():
                raise SolverCancelled("frontier computation cancelled")
            parts = np.array_split(np.arange(len(arrays[0])), min(threads, len(arrays[0])))
            for plans in pool.map(lambda rows: fn(*(a[rows] for a in arrays)), parts):
                add(plans)

        pick = np.unique(
            np.linspace(0, len(bp_t) - 1, min(initial_candidates, len(bp_t))).round().astype(int)
        )
        batched(rounder.round, bp_d[pick], bp_t[pick], np.ones(len(pick), dtype=bool))
        grid = np.linspace(t_min, t_max, 4096) if t_max > t_min else np.array([t_min])
        lb_grid = np.interp(grid, bp_t, bp_g) + pr * grid

        def frontier_now() -> tuple[Any, ...]:
            """All plans, their times and energies, the Pareto ones and each one's interval:
            its end and the gap at its peak, just before the end (where this plan plus waiting
            is still the best)."""
            allp = np.concatenate(found)
            times, energies = np.concatenate(found_t), np.concatenate(found_e)
            keep = _pareto(times, energies - pr * times)
            kt, kw = times[keep], (energies - pr * times)[keep]
            ends = np.r_[kt[1:], t_max] if kt[-1] < t_max else kt[1:]
            peak = (kw[: len(ends)] + pr * ends) / (np.interp(ends, bp_t, bp_g) + pr * ends) - 1
            return allp, times, energies, keep, kt, kw, ends, peak

        last_mean = np.inf
        for r in range(refine_rounds):
            allp, times, energies, keep, kt, kw, ends, peak = frontier_now()
            if progress is not None:
                progress(0.6 + 0.35 * r / refine_rounds)
            # stop once a round no longer lowers the mean gap over a grid noticeably
            idx = np.searchsorted(kt, grid * (1 + 1e-12), side="right") - 1
            gap = np.where(idx >= 0, (kw[np.maximum(idx, 0)] + pr * grid) / lb_grid - 1, np.inf)
            mean_gap = float(np.mean(np.minimum(gap, 1.0)))
            if mean_gap > 0.99 * last_mean:
                break
            last_mean = mean_gap
            # split the intervals with the highest peaks in the middle
            chosen = np.argsort(-peak, kind="stable")[:refine_batch]
            chosen = chosen[peak[chosen] > target_gap]
            if len(chosen) == 0:
                break
            at = (kt[chosen] + ends[chosen]) / 2
            batched(rounder.round, relaxed_at(at), at, np.ones(len(at), dtype=bool))
            # and, where the peak is high, a diagonal rounding there too
            high = at[peak[chosen] > hard_gap]
            if diagonal_rounding and len(high):
                batched(
                    rounder.round, relaxed_at(high), high, np.ones(len(high), dtype=bool),
                    diagonal_up_at(rng.random(len(high))),
                )  # fmt: skip
            # and the interval's own plan, given the slack up to the middle
            batched(rounder.reclaim, allp[keep[chosen]], at)
        # Intervals still peaking above hard_gap: randomised roundings in their middles (each
        # fractional node goes to the slower hull vertex past a random point of the way there,
        # when it fits; every other rounding diagonal), for the worst few at a time.
        for _ in range(hard_rounds):
            allp, times, energies, keep, kt, kw, ends, peak = frontier_now()
            hard = np.argsort(-peak, kind="stable")[:hard_intervals]
            hard = hard[peak[hard] > hard_gap]
            if len(hard) == 0 or random_trials == 0:
                break
            at = np.repeat((kt[hard] + ends[hard]) / 2, random_trials)
            batched(
                rounder.round,
                relaxed_at(at * (1 - 0.003 * rng.random(len(at)))),
                at,
                np.ones(len(at), dtype=bool),
                np.where(
                    (np.arange(len(at)) % 2 == 1)[:, None] & diagonal_rounding,
                    diagonal_up_at(rng.random(len(at))),
                    rng.random((len(at), problem.num_nodes)),
                ),
            )
        # A large-neighbourhood search on the fastest plan within its own time (the
        # zero-slowdown plan: what a pipeline without stragglers runs): SEARCH_STARTS
        # independently seeded searches side by side, in chunks so that cancelling is heard.
        allp, times, energies, keep, kt, kw, ends, peak = frontier_now()
        first_gap = (kw[0] + pr * kt[0]) / (np.interp(kt[0], bp_t, bp_g) + pr * kt[0]) - 1
        if effort > 0 and first_gap > hard_gap:
            total = max(1, int(effort * search_work) // problem.num_nodes)
            chunk = max(1, search_work // (2 * problem.num_nodes))
            plans = np.repeat(allp[keep[:1]], SEARCH_STARTS, axis=0)
            deadline = np.array([kt[0]])
            done = 0
            while done < total:
                if cancel is not None and cancel():
                    raise SolverCancelled("frontier computation cancelled")
                k = min(chunk, total - done)
                seeds = rng.integers(0, 2**31, SEARCH_STARTS)
                rows = [slice(i, i + 1) for i in range(SEARCH_STARTS)]
                runs = pool.map(
                    rounder.search,
                    [plans[r] for r in rows],
                    [deadline] * SEARCH_STARTS,
                    [seeds[r] for r in rows],
                    [k] * SEARCH_STARTS,
                )
                plans = np.concatenate(list(runs))
                add(plans)
                done += k
                if progress is not None:
                    progress(0.95 + 0.02 * done / total)
        # Each whole unit of effort past the first: a round of searches on the search_intervals
        # intervals with the highest peaks, each from the interval's plan within the interval's
        # middle (a new plan that splits it; searching within the plan's own time instead lowered
        # the worst gap far less for the same work: A40 8x12 at effort 4, 0.60 % against 0.42 %).
        rounds = max(0, int(effort) - 1)
        interval_trials = max(1, search_work // problem.num_nodes)

        def search_intervals_rows(p: Any, d: Any, s: Any) -> npt.NDArray[np.uint8]:
            return rounder.search(p, d, s, interval_trials)

        for r in range(rounds):
            if progress is not None:
                progress(0.97 + 0.02 * r / rounds)
            allp, times, energies, keep, kt, kw, ends, peak = frontier_now()
            hard = np.argsort(-peak, kind="stable")[:search_intervals]
            hard = hard[peak[hard] > hard_gap]
            if len(hard) == 0:
                break
            at = (kt[hard] + ends[hard]) / 2
            batched(search_intervals_rows, allp[keep[hard]], at, rng.integers(0, 2**31, len(hard)))
        # Polish the plans of the intervals with the highest peaks by exchanges: within their own
        # times (each kept exchange lowers the energy of the whole interval), and within the
        # interval's end (a plan that only fits there once another node is sped up).
        # (a pass of exchanges costs O(n^2): fewer plans for larger problems)
        polish_count = max(1, min(polish_plans, polish_nodes // problem.num_nodes))
        allp, times, energies, keep, kt, kw, ends, peak = frontier_now()
        polish = np.argsort(-peak, kind="stable")[:polish_count]
        polish = polish[peak[polish] > hard_gap]
        if len(polish):
            plans = allp[keep[polish]]
            batched(
                rounder.exchange,
                np.concatenate([plans, plans]),
                np.r_[kt[polish], ends[polish] * (1 - 1e-9)],
            )
            allp, times, energies, keep, kt, kw, ends, peak = frontier_now()

    fastest = problem.evaluate(problem.max_frequency_plan())
    ft = times[keep]
    fe = energies[keep]
    lb = np.interp(ft, bp_t, bp_g) + pr * ft
    # The slowest plan meets its bound exactly; don't let float rounding put the bound above it.
    lb = np.where((lb > fe) & (lb - fe <= 1e-9 * np.abs(fe)), fe, lb)
    if progress is not None:
        progress(1.0)
    return Frontier(
        schedule=dag.schedule,
        blocking_power=problem.blocking_power,
        max_frequency_time=fastest.time,
        max_frequency_energy=fastest.energy,
        times=ft,
        energies=fe,
        lower_bounds=lb,
        plans=allp[keep],
        node_freqs=problem.freqs,
        bound_times=bp_t,
        bound_energies=bp_g + pr * bp_t,
    )


def solve_frontier(
    profile: Profile,
    schedule: Schedule,
    blocking_power: float,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    effort: float = 1.0,
) -> Frontier:
    """The time-energy frontier of ``schedule`` on ``profile`` (see the module docstring).

    Args:
        profile: measured per-stage profile.
        schedule: the pipeline's per-rank instruction order.
        blocking_power: watts a GPU draws while waiting on the pipeline.
        progress: called with the fraction done (0..1) now and then.
        cancel: polled between steps; returning ``True`` raises :class:`SolverCancelled`.
        effort: how hard to search where plans are furthest from the bound (1: the
            zero-slowdown plan; 0: no search; see :func:`solve_problem`).
    """
    problem = EnergyProblem.build(profile, schedule, blocking_power)
    return solve_problem(problem, progress=progress, cancel=cancel, effort=effort)
