"""The solver's tuning knobs, as frozen values checked when they are made.

:class:`SolverOptions` says how much work :func:`perseus.solver.solve_problem` spends where, and
:class:`RoundingOptions` how :class:`perseus.solver.Rounder` gives slack back to a plan. The
defaults are what the CLI and the server use; a bad value raises
:class:`~perseus.errors.OptionError` naming the field.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from perseus.errors import OptionError

__all__ = ["SolverOptions", "RoundingOptions", "RELAXATIONS"]

#: The relaxation cores :class:`SolverOptions` accepts.
RELAXATIONS = ("sweep", "sandwich", "auto")


def _integer(owner: object, name: str, minimum: int) -> None:
    value = getattr(owner, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise OptionError(f"{name}: must be an integer >= {minimum}, got {value!r}", field=name)


def _number(
    owner: object, name: str, low: float, high: float = math.inf, *, open_low: bool = False
) -> None:
    value = getattr(owner, name)
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if ok:
        x = float(value)
        ok = math.isfinite(x) and (x > low if open_low else x >= low) and x <= high
    if not ok:
        what = f"> {low:g}" if open_low else f">= {low:g}"
        if math.isfinite(high):
            what += f" and <= {high:g}"
        raise OptionError(f"{name}: must be a finite number {what}, got {value!r}", field=name)


@dataclass(frozen=True)
class RoundingOptions:
    """How a plan's slack is reclaimed (see :mod:`perseus.kernels.rounding`).

    Attributes:
        levels: price levels of the first reclaim after rounding (no node past the hull vertex
            at or above its relaxed duration), and of every later reclaim.
        decay: factor by which the price falls from one level to the next, in ``(0, 1]``.
        max_rounds: forward/backward sweeps per price level at most.
        exchange_passes: passes of exchanges after each rounding or reclaim (0: none).
        free_levels: price levels of the second reclaim after rounding (any node, any option).
        free_decay: the second reclaim's factor per level, in ``(0, 1]``.
    """

    levels: int = 12
    decay: float = 0.7
    max_rounds: int = 8
    exchange_passes: int = 0
    free_levels: int = 2
    free_decay: float = 0.2

    def __post_init__(self) -> None:
        _integer(self, "levels", 0)
        _number(self, "decay", 0.0, 1.0, open_low=True)
        _integer(self, "max_rounds", 1)
        _integer(self, "exchange_passes", 0)
        _integer(self, "free_levels", 0)
        _number(self, "free_decay", 0.0, 1.0, open_low=True)


@dataclass(frozen=True)
class SolverOptions:
    """What :func:`perseus.solver.solve_problem` spends its work on, stage by stage.

    Seeding:
        initial_candidates: relaxed breakpoints rounded first, spread evenly by index
            (breakpoints crowd where the frontier bends).

    Refining. Between two consecutive plans of the frontier the gap to the bound peaks just
    before the second one's time (the first plan plus waiting is still the best there).
        refine_rounds: rounds of splitting the intervals with the highest peaks at their middle
            (rounds stop early once one no longer lowers the mean gap by 1 %).
        refine_batch: intervals split per round.
        target_gap: intervals peaking at or below this relative gap are left alone.
        hard_gap: the gap above which an interval is *hard*: it also gets a diagonal rounding
            when split, randomised roundings, searching and polishing.
        diagonal_rounding: whether hard intervals get diagonal roundings (every instruction of
            one microbatch and kind shares its rounding threshold on every stage).
        hard_rounds: rounds of randomised roundings on the hard intervals.
        hard_intervals: hard intervals (the worst) that each such round works on.
        random_trials: randomised roundings per hard interval and round (every other one
            diagonal when ``diagonal_rounding``).

    Searching:
        effort: 0 skips all searching. Otherwise, when the fastest plan (the zero-slowdown one)
            is itself above ``hard_gap``, it gets :data:`perseus.solver.SEARCH_STARTS`
            independently seeded large-neighbourhood searches of ``effort * search_work // n``
            trials each (``n`` instructions); each whole unit of effort past 1 adds a round of
            searches on the ``search_intervals`` hard intervals with the highest peaks.
        search_work: trials times instructions per unit of effort (so larger problems get
            fewer trials for the same work).
        search_intervals: intervals searched per round of extra effort, each from the
            interval's plan given the slack up to the interval's middle.

    Polishing:
        polish_plans: plans of the hard intervals with the highest peaks improved by exchanges,
            within their own time and within the interval's end.
        polish_nodes: a pass of exchanges costs ``O(n^2)``, so at most ``polish_nodes // n``
            plans are polished (at least one).

    Memory:
        relaxed_memory: bytes of relaxed durations kept from the sweep along the relaxed
            frontier (``n`` floats per kept breakpoint, at least 64 breakpoints): roundings
            between kept breakpoints interpolate. Below it, every breakpoint is kept.

    Relaxation:
        hull_tolerance: the sweep may run on hulls with fewer pieces (for hulls of at least
            ``THIN_MIN_VERTICES`` vertices: fine-grained clocks), each below its node's hull
            by at most this share of the node's least energy: the bound stays certified,
            looser by at most this share of the energy, with fewer breakpoints to visit
            (``0``: the exact hulls).
        relaxation: the relaxation core. ``"sweep"`` (the default): every breakpoint of
            ``G`` by the Phillips-Dessouky min-cut iteration, an exact bound, ``Theta(n^2)``
            on pipelines. ``"sandwich"``: ``G`` solved exactly at a few dozen deadlines (a
            warm-started network simplex per deadline), certified between them by tangent
            lines within ``sandwich_tolerance`` of the energy bound
            (:mod:`perseus.solver.sandwich`). ``"auto"``: the sandwich on interleaved schedules of
            at least 4 model chunks per rank (where the sweep falls into cold solves), the
            sweep elsewhere (measured faster there; see docs/solver.md).
        sandwich_tolerance: the sandwich stops once the gap between its chords and its
            tangents is at most this share of the energy bound everywhere (> 0).

    Cores:
        workers: threads the candidate batches run on (at most 8) and, when given (not
            ``None``) and above 1, processes the relaxed sweep is split over by deadline ranges
            (:mod:`perseus.solver.parallel`, from ``PARALLEL_MIN_NODES`` nodes). ``None`` (the
            default): the cores this process may run on for the threads, one sweep: measured,
            the ranges' exact starts (a cold network simplex, ~n^2.5) cost more than the range
            they save up to 8k instructions. The bound is the same either way (to a relative
            1e-9, lower where not equal); plans may differ where roundings start from
            different kept breakpoints. Without the ranges, from ``PIPELINE_MIN_NODES`` nodes
            the one sweep runs on a thread of its own beside the rounding of the deadlines it
            has passed (:mod:`perseus.solver.pipeline`), whatever ``workers`` is: the frontier
            does not depend on the number of threads.

    seed: the generator behind randomised roundings and searches; the same input and options
    give the same frontier. ``rounding``: how slack is reclaimed (:class:`RoundingOptions`).
    """

    initial_candidates: int = 192
    refine_rounds: int = 5
    refine_batch: int = 64
    target_gap: float = 2e-4
    hard_gap: float = 2.5e-3
    hard_rounds: int = 3
    hard_intervals: int = 8
    random_trials: int = 24
    polish_plans: int = 16
    polish_nodes: int = 4096
    effort: float = 1.0
    search_work: int = 400_000
    search_intervals: int = 16
    diagonal_rounding: bool = True
    relaxed_memory: int = 128 * 2**20
    hull_tolerance: float = 5e-4
    relaxation: str = "sweep"
    sandwich_tolerance: float = 5e-4
    seed: int = 0
    rounding: RoundingOptions = field(default_factory=RoundingOptions)
    workers: int | None = None

    def __post_init__(self) -> None:
        _integer(self, "initial_candidates", 1)
        if self.workers is not None:
            _integer(self, "workers", 1)
        for name in (
            "refine_rounds",
            "refine_batch",
            "hard_rounds",
            "hard_intervals",
            "random_trials",
            "polish_plans",
            "polish_nodes",
            "search_work",
            "search_intervals",
            "relaxed_memory",
            "seed",
        ):
            _integer(self, name, 0)
        for name in ("target_gap", "hard_gap", "effort", "hull_tolerance"):
            _number(self, name, 0.0)
        if self.relaxation not in RELAXATIONS:
            raise OptionError(
                f"relaxation: must be one of {', '.join(RELAXATIONS)}, got {self.relaxation!r}",
                field="relaxation",
            )
        if not (
            isinstance(self.sandwich_tolerance, (int, float))
            and not isinstance(self.sandwich_tolerance, bool)
            and 0 < self.sandwich_tolerance < 1
        ):
            raise OptionError(
                f"sandwich_tolerance: must be a number in (0, 1), got {self.sandwich_tolerance!r}",
                field="sandwich_tolerance",
            )
        if not isinstance(self.diagonal_rounding, bool):
            raise OptionError(
                f"diagonal_rounding: must be True or False, got {self.diagonal_rounding!r}",
                field="diagonal_rounding",
            )
        if not isinstance(self.rounding, RoundingOptions):
            raise OptionError(
                f"rounding: must be a RoundingOptions, got {type(self.rounding).__name__}",
                field="rounding",
            )

    @property
    def cores(self) -> int:
        """``workers``, or the cores this process may run on when it is None."""
        if self.workers is not None:
            return self.workers
        from perseus.solver.parallel import default_workers

        return default_workers()
