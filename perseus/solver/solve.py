"""The entry points of the solver.

The frontier of an :class:`~perseus.problem.EnergyProblem`, or of a profile and a schedule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

import perseus.solver.pipeline as _pipeline
import perseus.solver.stages as _stages
from perseus.errors import OptionError
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus.schedules import Schedule
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.candidates import CandidatePool
from perseus.solver.coupling import tighten
from perseus.solver.options import SolverOptions
from perseus.solver.parallel import RangeStats
from perseus.solver.pipeline import SweepStats, Window, overlapped
from perseus.solver.relaxation import Relaxation, path_bound
from perseus.solver.rounder import Rounder
from perseus.solver.sandwich import SandwichStats
from perseus.solver.stages import (
    Run,
    assemble,
    polish,
    refine,
    refine_window,
    relax,
    search,
    seed_candidates,
)

__all__ = [
    "solve_problem",
    "solve_frontier",
    "first_plan",
    "FirstPlan",
    "SolveStats",
    "AUTO_SANDWICH_CHUNKS",
]


@dataclass
class SolveStats:
    """Where a solve spent its time.

    Per stage ``(wall s, CPU s of this process)``, in order (``first plan``, ``relax``,
    ``round`` (seed and refine), ``search``, ``polish``), and the sandwich core's counters
    (deadlines solved, pivots) when it ran.
    """

    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    relaxation: str = "sweep"
    sandwich: SandwichStats | None = None
    #: the parallel sweep's ranges (their CPU is the workers', not in ``stages``)
    ranges: list[RangeStats] = field(default_factory=list)
    #: the sweeping thread's own figures when the sweep ran beside the rounding (then the
    #: ``relax`` stage also holds the rounding of the windows it passed)
    sweep: SweepStats | None = None

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as stage ``name``: wall and CPU seconds."""
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.stages[name] = (time.perf_counter() - w, time.process_time() - c)


#: ``relaxation="auto"`` runs the sandwich on interleaved schedules with at least this many
#: model chunks per rank, where the sweep's warm flow stops fitting and every step solves cold
#: (measured: 16 x 64 V=4, sweep killed at 600 s, sandwich 49 s CPU); the sweep elsewhere.
AUTO_SANDWICH_CHUNKS = 4

#: Called once, early in a solve, with a frontier of one point: the zero-slowdown plan.
FirstPlan = Callable[[Frontier], None]


def first_plan(problem: EnergyProblem, relaxation: Relaxation, rounder: Rounder) -> Frontier:
    """A deployable zero-slowdown plan before any relaxed sweep, as a frontier of one point.

    The all-max-frequency plan given the slack up to its own time (:meth:`Rounder.reclaim`),
    truly evaluated and kept only when it finishes within ``T0`` (else the all-max-frequency
    plan itself), as a frontier of one point.

    Its bound is :func:`~perseus.solver.relaxation.path_bound` at ``T0`` (certified but looser
    than the full solve's, so its gap reads higher); ``bound_times`` holds ``T0`` and the
    slowest relaxed time, so :meth:`~perseus.frontier.Frontier.lower_bound_at` stays
    certified at every deadline. Cost: one reclaim, ``O(levels x rounds x (nK + m))``.
    ``relaxation`` is the bounding model's (:meth:`EnergyProblem.cost_charged`, ``problem``'s
    own without per-clock transfers); ``rounder`` rounds on any model of the same DAG.
    """
    fastest = problem.max_frequency_plan()
    t0 = problem.evaluate(fastest)
    plan = rounder.reclaim(fastest[None, :], np.array([t0.time]))
    t, e = problem.evaluate_many(plan)
    if not (t[0] <= t0.time * (1 + 1e-12) and e[0] <= t0.energy):
        plan, t, e = fastest[None, :], np.array([t0.time]), np.array([t0.energy])
    pr = problem.blocking_power * problem.dag.num_ranks
    a, flow = path_bound(problem, relaxation, t0.time)
    t_max = max(float(problem.dag.iteration_time(relaxation.longest)), t0.time)
    bt = np.array([t0.time, t_max]) if t_max > t0.time else np.array([t0.time])
    be = a - flow * bt + pr * bt
    lb = float(np.interp(t[0], bt, be))
    return Frontier(
        schedule=problem.dag.schedule,
        blocking_power=problem.blocking_power,
        max_frequency_time=t0.time,
        max_frequency_energy=t0.energy,
        times=t,
        energies=e,
        lower_bounds=np.array([min(lb, float(e[0]))]),
        plans=plan,
        node_freqs=problem.freqs,
        bound_times=bt,
        bound_energies=be,
    )


def _ranges_run(problem: EnergyProblem, opts: SolverOptions, core: str) -> bool:
    """Whether :func:`relax` splits the sweep over worker processes (read where it reads it)."""
    return (
        core == "sweep"
        and (opts.workers or 1) > 1
        and problem.num_nodes >= _stages.PARALLEL_MIN_NODES
    )


_T = TypeVar("_T")
_U = TypeVar("_U")
_V = TypeVar("_V")


def _concurrently(
    first: Callable[[Callable[[], bool]], _T],
    second: Callable[[Callable[[], bool]], _U],
    cancel: Callable[[], bool] | None,
) -> tuple[_T, _U]:
    """``first`` here and ``second`` on another thread, each given a cancel callback.

    The callback is true once ``cancel`` is, or once the other side has raised, so a failure
    on either side stops both soon (cancelling is heard between compiled chunks); the first
    exception raised is the one that propagates.
    """
    errors: list[BaseException] = []
    lock = threading.Lock()

    def stop() -> bool:
        return bool(errors) or (cancel is not None and cancel())

    def guarded(fn: Callable[[Callable[[], bool]], _V]) -> _V:
        try:
            return fn(stop)
        except BaseException as exc:
            with lock:
                errors.append(exc)
            raise

    with ThreadPoolExecutor(1, thread_name_prefix="perseus-bound") as ex:
        later = ex.submit(guarded, second)
        try:
            a = guarded(first)
        except BaseException as exc:
            later.exception()  # waits: the other side has been told to stop
            if errors[0] is exc:
                raise
            raise errors[0] from exc  # this side stopped because the other failed
        b = later.exception()
        if b is not None:
            raise errors[0]
        return a, later.result()


def solve_problem(
    problem: EnergyProblem,
    options: SolverOptions | None = None,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_first_plan: FirstPlan | None = None,
    stats: SolveStats | None = None,
) -> Frontier:
    """The time-energy frontier of ``problem`` (see :mod:`perseus.solver`).

    Args:
        problem: the DAG and every node's measured options.
        options: how much work each stage gets (default :class:`SolverOptions()`).
        progress: called with the fraction done (0..1) now and then, never decreasing; 1 last.
        cancel: polled between steps; returning ``True`` raises
            :class:`~perseus.errors.SolverCancelled`.
        on_first_plan: called once, before the relaxed sweep (the bulk of the work), with a
            frontier of one point: a verified zero-slowdown plan (true time at most ``T0``;
            see :func:`first_plan`), deployable while the rest is solved. The final frontier's
            fastest plan is at least as good (the first plan is among its candidates). An
            exception it raises ends the solve.
        stats: filled in with each stage's wall and CPU time (:class:`SolveStats`).

    Every point of the result is a real plan with its true (time, energy), and carries the
    certified lower bound at its own time. The same problem and options give the same frontier.
    """
    opts = SolverOptions() if options is None else options
    if not isinstance(opts, SolverOptions):
        raise OptionError(
            f"options: must be a SolverOptions, got {type(opts).__name__}", field="options"
        )
    st = SolveStats() if stats is None else stats
    core = "sandwich" if opts.relaxation == "sandwich" else "sweep"
    if opts.relaxation == "auto" and problem.dag.schedule.virtual_stages >= AUTO_SANDWICH_CHUNKS:
        core = "sandwich"
    st.relaxation = core
    # Per-clock transfer times: the certified bound comes from the model of the shortest
    # transfers with each transfer's effective cost at its producer's clock charged to the
    # producer (the truth's costs, no longer durations: below the truth whatever the transfer
    # draws), plans from the model that also charges the transfer's extra time to its producer
    # (never late on the truth); every plan is evaluated on the truth either way.
    cores = opts.cores
    bounding = problem.cost_charged()
    planning = bounding.producer_charged()
    with st.stage("first plan"):
        bound_rel = Relaxation.build(bounding)
        base_rel = bound_rel if bounding is problem else Relaxation.build(problem)
        rounder = Rounder(problem, base_rel, opts.rounding)
        early = first_plan(problem, bound_rel, rounder)  # cheap; a candidate either way
        rel = bound_rel
        if planning is not bounding:
            rel = Relaxation.build(planning)
            rounder = Rounder(planning, rel, opts.rounding)
    if on_first_plan is not None:
        on_first_plan(early)
    if core == "sandwich":
        st.sandwich = SandwichStats()

    def relaxed_of(
        p: EnergyProblem,
        r: Relaxation,
        stats: SandwichStats | None,
        report: bool = True,
        cancel: Callable[[], bool] | None = cancel,
    ) -> RelaxedFrontier:
        return relax(
            p,
            memory=opts.relaxed_memory,
            progress=progress if report else None,
            cancel=cancel,
            relaxation=r,
            hull_tolerance=opts.hull_tolerance,
            core=core,
            tolerance=opts.sandwich_tolerance,
            stats=stats,
            workers=opts.workers or 1,  # the range sweep only when asked for (see options)
            ranges=st.ranges if report else None,
        )

    if _pipelined(problem, planning is not bounding, opts, core):
        return _solve_overlapped(problem, planning, rel, rounder, early, opts, st, cancel, progress)
    with st.stage("relax"):
        if planning is bounding:
            relaxed = bound = relaxed_of(planning, rel, st.sandwich)
        elif cores > 1 and not _ranges_run(problem, opts, core):
            # two independent relaxations (compiled, the GIL released): the bound's on a second
            # thread, the same result as one after the other (not beside the range sweep,
            # whose processes fork)
            relaxed, bound = _concurrently(
                lambda stop: relaxed_of(planning, rel, st.sandwich, cancel=stop),
                lambda stop: relaxed_of(bounding, bound_rel, None, report=False, cancel=stop),
                cancel,
            )
        else:
            relaxed = relaxed_of(planning, rel, st.sandwich)
            bound = relaxed_of(bounding, bound_rel, None, report=False)
        if planning is not bounding:
            # per-clock transfers: raised by pricing the producer-transfer coupling
            bound = tighten(problem, bound, lambda p, r: relaxed_of(p, r, None, report=False))
    with CandidatePool(planning, relaxed, cancel, threads=cores) as pool:
        run = Run(
            planning, relaxed, rounder, pool, opts, np.random.default_rng(opts.seed), progress,
            bound,
        )  # fmt: skip
        pool.add(early.plans)
        with st.stage("round"):
            seed_candidates(run)
        return _finish(run, st, problem, bound)


def _solve_overlapped(
    problem: EnergyProblem,
    planning: EnergyProblem,
    rel: Relaxation,
    rounder: Rounder,
    early: Frontier,
    opts: SolverOptions,
    st: SolveStats,
    cancel: Callable[[], bool] | None,
    progress: Callable[[float], None] | None,
) -> Frontier:
    """The sweep on its own thread, each window it has passed rounded meanwhile (pipeline.py).

    ``planning`` is the model plans are rounded on (one that also bounds: no per-clock
    transfers); ``problem`` the truth they are evaluated on.
    """
    with CandidatePool(planning, None, cancel, threads=opts.cores) as pool:
        pool.add(early.plans)
        pool.add(problem.max_frequency_plan()[None, :])
        rng = np.random.default_rng(opts.seed)

        def work(w: Window) -> None:
            refine_window(Run(planning, w.relaxed, rounder, pool, opts, rng), w)

        st.sweep = SweepStats()
        with st.stage("relax"):
            relaxed = overlapped(
                planning, rel, work, memory=opts.relaxed_memory, cancel=cancel,
                progress=_scaled(progress, 0.6), hulls=_thinned(planning, rel, opts),
                stats=st.sweep,
            )  # fmt: skip
        run = Run(planning, relaxed, rounder, pool, opts, rng, progress)
        return _finish(run, st, problem, relaxed, windowed=True)


def _finish(
    run: Run,
    st: SolveStats,
    problem: EnergyProblem,
    bound: RelaxedFrontier,
    windowed: bool = False,
) -> Frontier:
    """Refine, search and polish ``run``'s candidates, and assemble the frontier.

    ``windowed``: the windows of the pipeline had their randomised roundings already, so the
    refinement only splits the worst intervals of the whole range.
    """
    run.pool.relaxed = run.relaxed
    with st.stage("round"):
        refine(run, randomised=not windowed)
    with st.stage("search"):
        search(run)
    with st.stage("polish"):
        polish(run)
    return assemble(problem, bound, run.pool.snapshot(), run.progress)


def _pipelined(problem: EnergyProblem, clocked: bool, opts: SolverOptions, core: str) -> bool:
    """Whether the sweep runs beside the rounding (:mod:`perseus.solver.pipeline`).

    From ``PIPELINE_MIN_NODES`` nodes, with the sweep core, without per-clock transfers (two
    relaxations) and without the range sweep.
    """
    return (
        core == "sweep"
        and not clocked
        and problem.num_nodes >= _pipeline.PIPELINE_MIN_NODES
        and not _ranges_run(problem, opts, core)
    )


def _scaled(progress: Callable[[float], None] | None, by: float) -> Callable[[float], None] | None:
    """``progress`` reporting ``by`` times each fraction (None stays None)."""
    return None if progress is None else (lambda f: progress(by * f))


def _thinned(problem: EnergyProblem, rel: Relaxation, opts: SolverOptions) -> Relaxation | None:
    """The hulls the sweep runs on (:meth:`Relaxation.under_estimate`), or None: ``rel``'s."""
    if opts.hull_tolerance <= 0:
        return None
    valid = np.arange(problem.energies.shape[1])[None, :] < problem.num_options[:, None]
    floor = np.where(valid, problem.energies, np.inf).min(axis=1)
    hulls = rel.under_estimate(np.maximum(floor, 0.0), opts.hull_tolerance)
    return None if hulls is rel else hulls


def solve_frontier(
    profile: Profile,
    schedule: Schedule,
    blocking_power: float,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    effort: float | None = None,
    options: SolverOptions | None = None,
    on_first_plan: FirstPlan | None = None,
) -> Frontier:
    """The time-energy frontier of ``schedule`` on ``profile`` (see :mod:`perseus.solver`).

    Args:
        profile: measured per-stage profile.
        schedule: the pipeline's per-rank instruction order.
        blocking_power: watts a GPU draws while waiting on the pipeline.
        progress: called with the fraction done (0..1) now and then.
        cancel: polled between steps; returning ``True`` raises
            :class:`~perseus.errors.SolverCancelled`.
        effort: how hard to search where plans are furthest from the bound (1: the
            zero-slowdown plan; 0: no search; see :class:`SolverOptions`); when given, it
            replaces ``options.effort``.
        options: every other knob (default :class:`SolverOptions()`).
        on_first_plan: the early zero-slowdown plan, as in :func:`solve_problem`.

    Raises:
        ProfileError: the profile does not fit the schedule, or ``blocking_power`` is bad.
        OptionError: an option (``effort``...) is out of range.
    """
    opts = SolverOptions() if options is None else options
    if effort is not None:
        opts = replace(opts, effort=effort)  # validated again
    problem = EnergyProblem.build(profile, schedule, blocking_power)
    return solve_problem(
        problem, opts, progress=progress, cancel=cancel, on_first_plan=on_first_plan
    )
