"""The stages of a solve, in the order :func:`perseus.solver.solve_problem` runs them.

relax -> seed candidates -> refine -> search -> polish -> assemble. Every stage after the first
works on one :class:`Run`: it reads the :class:`~perseus.solver.candidates.CandidatePool`'s
snapshot, decides where the frontier is furthest from the bound, and adds the plans it makes
there. Randomness comes from the run's seeded generator only, in a fixed order, so a solve is
reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.solver import coupling
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.candidates import CandidatePool, Snapshot
from perseus.solver.options import SolverOptions
from perseus.solver.parallel import PARALLEL_MIN_NODES, RangeStats, parallel_sweep
from perseus.solver.pipeline import Window
from perseus.solver.relaxation import Relaxation
from perseus.solver.rounder import Rounder
from perseus.solver.sandwich import SandwichStats, sandwich_frontier

__all__ = [
    "SEARCH_STARTS",
    "Run",
    "relax",
    "seed_candidates",
    "refine",
    "refine_window",
    "search",
    "polish",
    "assemble",
    "diagonal_up_at",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
PlanArray = npt.NDArray[np.uint8]
Progress = Callable[[float], None] | None

#: Independent searches of the zero-slowdown plan with ``effort > 0`` (a fixed number, so the
#: result does not depend on the machine's cores).
SEARCH_STARTS = 2
_GOLDEN = (np.sqrt(5.0) - 1) / 2
#: Per-clock transfers: intervals searched on their anchored models, and the re-anchorings.
ANCHORED_SEARCHES = 16
ANCHORED_ROUNDS = 4
#: Per-clock transfers: plans x instructions improved on their anchored models.
ANCHORED_WORK = 200_000
#: Per-clock transfers: the bound's relaxed optimum is rounded this much before the middles
#: of the worst intervals (its plans run late on the truth).
ANCHORED_EARLIER = (0.0, 0.001, 0.003)
#: Per-clock transfers: passes splitting the worst intervals in the middle, anchored.
ANCHORED_PASSES = 5
#: Per-clock transfers: search trials per plan in those passes (with ``effort > 0``).
ANCHORED_TRIALS = 256
#: Deadlines over which the refinement's mean gap is measured.
_GRID_POINTS = 4096


@dataclass(frozen=True, eq=False)
class Run:
    """What the stages after :func:`relax` share.

    The problem, its relaxed frontier, the rounder, the candidates found so far, the options,
    the seeded generator, the progress callback and the certified bound's relaxed frontier (when
    it is not ``relaxed``'s: per-clock transfers).
    """

    problem: EnergyProblem
    relaxed: RelaxedFrontier
    rounder: Rounder
    pool: CandidatePool
    options: SolverOptions
    rng: np.random.Generator
    progress: Progress = None
    bound: RelaxedFrontier | None = None
    #: ``(lo, hi)``: the refinement works only on the intervals whose middle lies in it
    window: tuple[float, float] | None = None

    def report(self, fraction: float) -> None:
        """Pass ``fraction`` of the solve done to the progress callback, if any."""
        if self.progress is not None:
            self.progress(fraction)

    def snapshot(self) -> Snapshot:
        """The pool's snapshot; within a window, the intervals outside it never peak."""
        snap = self.pool.snapshot()
        if self.window is None:
            return snap
        lo, hi = self.window
        mid = snap.middles(np.arange(len(snap.ends)))
        return replace(snap, peak=np.where((mid >= lo) & (mid <= hi), snap.peak, -np.inf))


def relax(
    problem: EnergyProblem,
    *,
    memory: int = 128 * 2**20,
    progress: Progress = None,
    cancel: Callable[[], bool] | None = None,
    relaxation: Relaxation | None = None,
    hull_tolerance: float = 0.0,
    core: str = "sweep",
    tolerance: float = 5e-4,
    stats: SandwichStats | None = None,
    workers: int = 1,
    ranges: list[RangeStats] | None = None,
) -> RelaxedFrontier:
    """The relaxed frontier (progress runs to 0.6).

    ``core="sweep"`` (or ``"auto"``): every breakpoint, the durations of about ``memory`` bytes'
    worth of them kept; ``core="sandwich"``: exact solves at a few deadlines, tangent lines
    between them within ``tolerance`` (:func:`~perseus.solver.sandwich.sandwich_frontier`,
    ``stats`` filled in). With ``hull_tolerance > 0`` either runs on hulls with fewer pieces,
    each below its node's by at most ``hull_tolerance`` times the node's least energy
    (:meth:`Relaxation.under_estimate`): a bound looser by at most that share of the energy,
    with fewer breakpoints to visit (fewer arcs to price). ``workers > 1``: the sweep over
    deadline ranges in that many processes (:func:`~perseus.solver.parallel.parallel_sweep`,
    from ``PARALLEL_MIN_NODES`` nodes; ``ranges`` gets each range's figures).
    """
    rel = Relaxation.build(problem) if relaxation is None else relaxation
    hulls = None
    if hull_tolerance > 0:
        valid = np.arange(problem.energies.shape[1])[None, :] < problem.num_options[:, None]
        floor = np.where(valid, problem.energies, np.inf).min(axis=1)
        hulls = rel.under_estimate(np.maximum(floor, 0.0), hull_tolerance)
    if core == "sandwich":
        return sandwich_frontier(
            problem,
            rel,
            hulls=hulls,
            tolerance=tolerance,
            cancel=cancel,
            progress=None if progress is None else (lambda f: progress(0.6 * f)),
            stats=stats,
        )
    if workers > 1 and problem.num_nodes >= PARALLEL_MIN_NODES:
        return parallel_sweep(
            problem,
            rel,
            workers=workers,
            memory=memory,
            cancel=cancel,
            progress=None if progress is None else (lambda f: progress(0.6 * f)),
            hulls=hulls,
            stats=ranges,
        )
    return RelaxedFrontier.sweep(
        problem,
        rel,
        memory=memory,
        cancel=cancel,
        progress=None if progress is None else (lambda f: progress(0.6 * f)),
        hulls=hulls,
    )


def diagonal_up_at(problem: EnergyProblem, offsets: FloatArray) -> FloatArray:
    """Rounding thresholds shared by a microbatch's instructions of one kind on every stage.

    One row per offset. Successive microbatches' thresholds a golden-ratio step apart (evenly
    spread for any run of them), each kind's half a turn from the forwards'.
    """
    dag = problem.dag
    out: FloatArray = (
        dag.microbatch[None, :] * _GOLDEN + 0.5 * dag.kind[None, :] + offsets[:, None]
    ) % 1.0
    return out


def seed_candidates(run: Run) -> None:
    """The all-max-frequency plan, and some relaxed breakpoints rounded.

    ``initial_candidates`` relaxed breakpoints, spread evenly by index.
    """
    run.pool.add(run.problem.max_frequency_plan()[None, :])
    rf = run.relaxed
    bp_t = rf.times
    count = min(run.options.initial_candidates, len(bp_t))
    at = bp_t[np.unique(np.linspace(0, len(bp_t) - 1, count).round().astype(int))]
    if rf.slopes.size and run.options.initial_candidates > len(bp_t) and rf.t_max > rf.t_min:
        # a few solved deadlines (the sandwich): the rest spread in time, denser near T0
        extra = run.options.initial_candidates - len(bp_t)
        u = np.linspace(0.0, 1.0, extra + 2)[1:-1]
        at = np.unique(np.r_[at, rf.t_min + (rf.t_max - rf.t_min) * u**2])
    run.pool.batched(run.rounder.round, rf.durations_at(at), at, np.ones(len(at), dtype=bool))


def refine(run: Run, randomised: bool = True) -> None:
    """Split the intervals whose gap peaks highest, then give the hard ones randomised roundings.

    Splitting goes round after round; progress runs from 0.6 to 0.95. ``randomised=False``:
    the splitting only.
    """
    _split_rounds(run)
    if randomised:
        _randomised_rounds(run)


def _split_rounds(run: Run) -> None:
    """Up to ``refine_rounds`` rounds of :func:`_split`, while each lowers the mean gap by 1 %.

    Stops once a round no longer lowers the mean gap over a grid of deadlines by 1 %.
    """
    rf = run.relaxed
    lo, hi = (rf.t_min, rf.t_max) if run.window is None else run.window
    grid = np.linspace(lo, hi, _GRID_POINTS) if hi > lo else np.array([lo])
    lb_grid = rf.bound(grid)
    rounds = run.options.refine_rounds
    last_mean = np.inf
    for r in range(rounds):
        snap = run.snapshot()
        run.report(0.6 + 0.35 * r / rounds)
        mean_gap = _mean_gap(snap, grid, lb_grid, rf.ranks_power)
        if mean_gap > 0.99 * last_mean:
            break
        last_mean = mean_gap
        if not _split(run, snap):
            break


def _mean_gap(snap: Snapshot, grid: FloatArray, lb_grid: FloatArray, pr: float) -> float:
    """The mean over ``grid`` of the best found plan's gap to the bound ``lb_grid``.

    The plan's energy includes waiting; each gap is capped at 1.
    """
    kt, kw = snap.kept_times, snap.kept_waiting
    idx = np.searchsorted(kt, grid * (1 + 1e-12), side="right") - 1
    gap = np.where(idx >= 0, (kw[np.maximum(idx, 0)] + pr * grid) / lb_grid - 1, np.inf)
    return float(np.mean(np.minimum(gap, 1.0)))


def _split(run: Run, snap: Snapshot) -> bool:
    """Split the ``refine_batch`` intervals peaking highest; returns whether any was split.

    At the middle of each of the intervals peaking highest (above ``target_gap``): the relaxed
    optimum rounded, a diagonal rounding too where the peak is above ``hard_gap``, and the
    interval's own plan given the slack up to there. Returns whether any interval was split.
    """
    o = run.options
    chosen = snap.worst(o.refine_batch, o.target_gap)
    if len(chosen) == 0:
        return False
    rf, rounder, pool = run.relaxed, run.rounder, run.pool
    at = snap.middles(chosen)
    pool.batched(rounder.round, rf.durations_at(at), at, np.ones(len(at), dtype=bool))
    high = at[snap.peak[chosen] > o.hard_gap]
    if o.diagonal_rounding and len(high):
        pool.batched(
            rounder.round, rf.durations_at(high), high, np.ones(len(high), dtype=bool),
            diagonal_up_at(run.problem, run.rng.random(len(high))),
        )  # fmt: skip
    pool.batched(rounder.reclaim, snap.kept_plans(chosen), at)
    return True


def _randomised_rounds(run: Run) -> None:
    """Randomised roundings of the intervals still peaking above ``hard_gap``.

    Up to ``hard_rounds`` times, ``random_trials`` randomised roundings in the middle of each of
    the ``hard_intervals`` worst (each fractional node goes to the slower hull vertex past a
    random point of the way there, when it fits; every other rounding diagonal).
    """
    o, rng = run.options, run.rng
    for _ in range(o.hard_rounds):
        snap = run.snapshot()
        hard = snap.worst(o.hard_intervals, o.hard_gap)
        if len(hard) == 0 or o.random_trials == 0:
            break
        at = np.repeat(snap.middles(hard), o.random_trials)
        run.pool.batched(
            run.rounder.round,
            run.relaxed.durations_at(at * (1 - 0.003 * rng.random(len(at)))),
            at,
            np.ones(len(at), dtype=bool),
            np.where(
                (np.arange(len(at)) % 2 == 1)[:, None] & o.diagonal_rounding,
                diagonal_up_at(run.problem, rng.random(len(at))),
                rng.random((len(at), run.problem.num_nodes)),
            ),
        )


def refine_window(run: Run, window: Window) -> None:
    """The pipeline's work on one window of deadlines the sweep has passed.

    Its breakpoints rounded (``initial_candidates`` x its share, spread by index), then
    :func:`refine` on the intervals whose middle lies in it, with ``refine_batch`` and
    ``hard_intervals`` scaled to its share (at least one each), on the frontier of the moment
    the window was handed over (its bound exact there). No progress is reported.
    """
    o, share = run.options, window.share
    opts = replace(
        o,
        initial_candidates=math.ceil(o.initial_candidates * share),
        refine_batch=math.ceil(o.refine_batch * share),
        hard_intervals=math.ceil(o.hard_intervals * share),
    )
    rf = window.relaxed
    wrun = replace(run, relaxed=rf, options=opts, progress=None, window=(window.lo, window.hi))
    run.pool.relaxed = rf
    inside = np.flatnonzero((rf.times >= window.lo) & (rf.times <= window.hi))
    if len(inside) == 0:
        return
    pick = np.unique(np.linspace(0, len(inside) - 1, opts.initial_candidates).round().astype(int))
    at = rf.times[inside[pick]]
    run.pool.batched(run.rounder.round, rf.durations_at(at), at, np.ones(len(at), dtype=bool))
    refine(wrun)


def search(run: Run) -> None:
    """Large-neighbourhood searches on the zero-slowdown plan and the worst intervals.

    The zero-slowdown plan's, then one round on the worst intervals per whole unit of ``effort``
    past 1 (progress runs from 0.95 to 0.99).
    """
    _search_fastest(run)
    _search_intervals(run)


def _search_fastest(run: Run) -> None:
    """Independently seeded searches on the fastest plan within its own time, when it is worth it.

    When ``effort > 0`` and the fastest plan (the zero-slowdown one: what a pipeline without
    stragglers runs) is above ``hard_gap``: :data:`SEARCH_STARTS` independently seeded searches
    within its own time, side by side, in chunks so that cancelling is heard.
    """
    o, pool = run.options, run.pool
    snap = pool.snapshot()
    kt, kw = snap.kept_times, snap.kept_waiting
    first_gap = (kw[0] + run.relaxed.ranks_power * kt[0]) / run.relaxed.bound(kt[0]) - 1
    if not (o.effort > 0 and first_gap > o.hard_gap):
        return
    n = run.problem.num_nodes
    total = max(1, int(o.effort * o.search_work) // n)
    chunk = max(1, o.search_work // (2 * n))
    plans = np.repeat(snap.plans[snap.keep[:1]], SEARCH_STARTS, axis=0)
    deadline = np.array([kt[0]])
    rows = [slice(i, i + 1) for i in range(SEARCH_STARTS)]
    done = 0
    while done < total:
        pool.check_cancel()
        k = min(chunk, total - done)
        seeds = run.rng.integers(0, 2**31, SEARCH_STARTS)
        runs = pool.map(
            run.rounder.search,
            [plans[r] for r in rows],
            [deadline] * SEARCH_STARTS,
            [seeds[r] for r in rows],
            [k] * SEARCH_STARTS,
        )
        plans = np.concatenate(runs)
        pool.add(plans)
        done += k
        run.report(0.95 + 0.02 * done / total)


def _search_intervals(run: Run) -> None:
    """A round of searches on the worst intervals per whole unit of ``effort`` past 1.

    A round of searches on the ``search_intervals`` intervals with the highest peaks above
    ``hard_gap``, each from the interval's plan within the interval's middle (a new plan there
    splits the interval).
    """
    o = run.options
    rounds = max(0, int(o.effort) - 1)
    trials = max(1, o.search_work // run.problem.num_nodes)

    def search_rows(plans: PlanArray, deadlines: FloatArray, seeds: IntArray) -> PlanArray:
        return run.rounder.search(plans, deadlines, seeds, trials)

    for r in range(rounds):
        run.report(0.97 + 0.02 * r / rounds)
        snap = run.pool.snapshot()
        hard = snap.worst(o.search_intervals, o.hard_gap)
        if len(hard) == 0:
            break
        seeds = run.rng.integers(0, 2**31, len(hard))
        run.pool.batched(search_rows, snap.kept_plans(hard), snap.middles(hard), seeds)


def polish(run: Run) -> None:
    """Improve by exchanges the plans of the ``polish_plans`` intervals peaking highest.

    Only intervals above ``hard_gap``. Within their own times (each kept exchange lowers the
    energy of the whole interval), and within the interval's end (a plan that only fits there
    once another node is sped up). A pass of exchanges costs ``O(n^2)``: at most ``polish_nodes
    // n`` plans.
    """
    o = run.options
    count = max(1, min(o.polish_plans, o.polish_nodes // run.problem.num_nodes))
    snap = run.pool.snapshot()
    chosen = snap.worst(count, o.hard_gap)
    if len(chosen):
        plans = snap.kept_plans(chosen)
        run.pool.batched(
            run.rounder.exchange,
            np.concatenate([plans, plans]),
            np.r_[snap.kept_times[chosen], snap.ends[chosen] * (1 - 1e-9)],
        )
    if run.problem.clocked_transfers.size:
        _polish_anchored(run)


def _polish_anchored(run: Run) -> None:
    """Per-clock transfers: the plans found improved on their anchored models.

    Improved by :func:`~perseus.solver.coupling.improve_plans` (the truth's times around
    each plan, where the planning model makes a producer's rank wait for its transfer): every
    Pareto plan (up to ``ANCHORED_WORK // n``, those furthest from the certified bound first)
    within its own time and within its interval's end; ``ANCHORED_PASSES`` times, the worst
    intervals (as many, in half the work) within their middles, with ``ANCHORED_TRIALS``
    search trials each; then the ``ANCHORED_SEARCHES`` intervals still furthest with
    ``effort x search_work // n`` search trials in all.
    """
    o = run.options
    anchoring = coupling.Anchoring(run.problem, run.rounder.options)
    n = run.problem.num_nodes
    ref = run.relaxed if run.bound is None else run.bound

    def worst(count: int) -> tuple[Snapshot, IntArray]:
        snap = run.pool.snapshot()
        peak = (snap.kept_waiting[: len(snap.ends)] + ref.ranks_power * snap.ends) / ref.bound(
            snap.ends
        ) - 1
        chosen = np.argsort(-peak, kind="stable")[:count]
        return snap, chosen[peak[chosen] > o.target_gap]

    snap, chosen = worst(max(1, ANCHORED_WORK // n))
    if len(chosen) == 0:
        return
    if run.bound is not None:
        # the bound's relaxed optimum (the shortest transfers) rounded on the shortest
        # transfers: late on the truth, each plan lands at its own true time
        mid = snap.middles(chosen)
        at = np.concatenate([mid * (1 - x) for x in ANCHORED_EARLIER])
        at = at[at >= run.bound.t_min]
        run.pool.batched(
            anchoring.rounder.round,
            run.bound.durations_at(at),
            at,
            np.ones(len(at), dtype=bool),
        )
        snap, chosen = worst(max(1, ANCHORED_WORK // n))
    plans = snap.kept_plans(chosen)
    run.pool.batched(
        lambda p, d: coupling.improve_plans(anchoring, p, d, rounds=2),
        np.concatenate([plans, plans]),
        np.r_[snap.kept_times[chosen], snap.ends[chosen] * (1 - 1e-9)],
    )
    trials = ANCHORED_TRIALS if o.effort > 0 else 0
    for _ in range(ANCHORED_PASSES):
        snap, chosen = worst(max(1, ANCHORED_WORK // (2 * n)))
        if len(chosen) == 0:
            return
        run.pool.batched(
            lambda p, d, s: coupling.improve_plans(
                anchoring, p, d, rounds=2, trials=trials, seeds=s
            ),
            snap.kept_plans(chosen),
            snap.middles(chosen),
            run.rng.integers(0, 2**31, len(chosen)),
        )
    if o.effort <= 0:
        return
    snap, hard = worst(ANCHORED_SEARCHES)
    if len(hard) == 0:
        return
    trials = max(ANCHORED_ROUNDS, int(o.effort * o.search_work) // (n * len(hard)))
    run.pool.batched(
        lambda p, d, s: coupling.improve_plans(
            anchoring, p, d, rounds=ANCHORED_ROUNDS, trials=trials, seeds=s
        ),
        snap.kept_plans(hard),
        snap.ends[hard] * (1 - 1e-9),
        run.rng.integers(0, 2**31, len(hard)),
    )


def assemble(
    problem: EnergyProblem, relaxed: RelaxedFrontier, found: Snapshot, progress: Progress = None
) -> Frontier:
    """The :class:`~perseus.frontier.Frontier` of the Pareto plans found (progress reaches 1).

    Each with the bound at its own time.
    """
    fastest = problem.evaluate(problem.max_frequency_plan())
    ft = found.times[found.keep]
    fe = found.energies[found.keep]
    lb = relaxed.bound(ft)
    # The slowest plan meets its bound exactly; don't let float rounding put the bound above it.
    lb = np.where((lb > fe) & (lb - fe <= 1e-9 * np.abs(fe)), fe, lb)
    if progress is not None:
        progress(1.0)
    rb = relaxed.relaxed_bound
    return Frontier(
        schedule=problem.dag.schedule,
        blocking_power=problem.blocking_power,
        max_frequency_time=fastest.time,
        max_frequency_energy=fastest.energy,
        times=ft,
        energies=fe,
        lower_bounds=lb,
        plans=found.plans[found.keep],
        node_freqs=problem.freqs,
        bound_times=rb.times,
        bound_energies=rb.values,
        bound_slopes=rb.slopes,
    )
