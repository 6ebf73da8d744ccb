"""The entry points: the frontier of an :class:`~perseus.problem.EnergyProblem`, or of a profile
and a schedule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from perseus.errors import OptionError
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus.schedules import Schedule
from perseus.solver.candidates import CandidatePool
from perseus.solver.options import SolverOptions
from perseus.solver.rounder import Rounder
from perseus.solver.stages import Run, assemble, polish, refine, relax, search, seed_candidates

__all__ = ["solve_problem", "solve_frontier"]


def solve_problem(
    problem: EnergyProblem,
    options: SolverOptions | None = None,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Frontier:
    """The time-energy frontier of ``problem`` (see :mod:`perseus.solver`).

    Args:
        problem: the DAG and every node's measured options.
        options: how much work each stage gets (default :class:`SolverOptions()`).
        progress: called with the fraction done (0..1) now and then, never decreasing; 1 last.
        cancel: polled between steps; returning ``True`` raises
            :class:`~perseus.errors.SolverCancelled`.

    Every point of the result is a real plan with its true (time, energy), and carries the
    certified lower bound at its own time. The same problem and options give the same frontier.
    """
    opts = SolverOptions() if options is None else options
    if not isinstance(opts, SolverOptions):
        raise OptionError(
            f"options: must be a SolverOptions, got {type(opts).__name__}", field="options"
        )
    relaxed = relax(problem, progress=progress, cancel=cancel)
    rounder = Rounder(problem, relaxed.relaxation, opts.rounding)
    with CandidatePool(problem, relaxed, cancel) as pool:
        run = Run(problem, relaxed, rounder, pool, opts, np.random.default_rng(opts.seed), progress)
        seed_candidates(run)
        refine(run)
        search(run)
        polish(run)
        found = pool.snapshot()
    return assemble(problem, relaxed, found, progress)


def solve_frontier(
    profile: Profile,
    schedule: Schedule,
    blocking_power: float,
    *,
    progress: Callable[[float], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    effort: float | None = None,
    options: SolverOptions | None = None,
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

    Raises:
        ProfileError: the profile does not fit the schedule, or ``blocking_power`` is bad.
        OptionError: an option (``effort``...) is out of range.
    """
    opts = SolverOptions() if options is None else options
    if effort is not None:
        opts = replace(opts, effort=effort)  # validated again
    problem = EnergyProblem.build(profile, schedule, blocking_power)
    return solve_problem(problem, opts, progress=progress, cancel=cancel)
