"""The relaxed frontier of a sweep: every breakpoint, some durations, and the bound they give.

:class:`RelaxedFrontier` holds the breakpoints of ``G(T)`` that a sweep
(:func:`perseus.solver.relaxation.sweep_range`) or the sandwich
(:mod:`perseus.solver.sandwich`) found, the relaxed durations kept at some of them, and the
certified energy bound ``G(T) + P R T`` they give at any ``T``
(:class:`~perseus.bound.RelaxedBound`); between two kept breakpoints it interpolates the
relaxed optimum's durations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from perseus.bound import TIME_SLACK, RelaxedBound, interpolate_durations
from perseus.problem import EnergyProblem
from perseus.solver.relaxation import Relaxation, RelaxedStep, sweep_range

__all__ = ["RelaxedFrontier"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class RelaxedFrontier:
    """Every breakpoint of the relaxed frontier, by increasing time, and the bound they give.

    Also the relaxed optimum's durations at some of them.

    Attributes:
        relaxation: the hulls the breakpoints come from.
        times, costs: ``(b,)`` iteration times and ``G(T)`` at the breakpoints.
        kept_times, kept_durations: ``(k,)`` and ``(k, n)``: the breakpoints whose durations
            are kept (the slowest and the fastest among them) and those durations. Between two
            kept breakpoints :meth:`durations_at` interpolates: a convex combination of feasible
            durations is feasible for the same combination of times (the longest path is
            convex in the durations), so it is a relaxed solution within its deadline, the
            optimum itself wherever no breakpoint lies between.
        t_min, t_max: the fastest iteration time, and that of the longest durations.
        ranks_power: blocking power times ranks (``P R``), what an idle second of the whole
            pipeline costs.
        slopes: empty when ``times`` are every breakpoint (the sweep); otherwise ``G``'s
            slope at each of ``times`` (deadlines solved exactly, certified between them by
            their tangent lines: :attr:`relaxed_bound`).
    """

    relaxation: Relaxation
    times: FloatArray
    costs: FloatArray
    kept_times: FloatArray
    kept_durations: FloatArray
    t_min: float
    t_max: float
    ranks_power: float
    slopes: FloatArray = field(default_factory=lambda: np.empty(0))

    @cached_property
    def relaxed_bound(self) -> RelaxedBound:
        """The energy bound ``G(T) + P R T`` (:class:`~perseus.bound.RelaxedBound`).

        With the kept durations.
        """
        pr = self.ranks_power
        values = self.costs + pr * self.times
        kept = {"kept_times": self.kept_times, "kept_durations": self.kept_durations}
        if self.slopes.size:
            return RelaxedBound.tangents(self.times, values, self.slopes + pr, **kept)
        return RelaxedBound.breakpoints(self.times, values, pr, **kept)

    @classmethod
    def from_steps(
        cls, problem: EnergyProblem, relaxation: Relaxation, steps: list[RelaxedStep]
    ) -> RelaxedFrontier:
        """The frontier of ``steps`` as :func:`relaxed_frontier` yields them (slowest first).

        Every step's durations are kept.
        """
        ordered = steps[::-1]  # by increasing time
        times = np.array([s.time for s in ordered])
        return cls.from_arrays(
            problem,
            relaxation,
            times,
            np.array([s.cost for s in ordered]),
            times,
            np.stack([s.durations for s in ordered]),
        )

    @classmethod
    def sweep(
        cls,
        problem: EnergyProblem,
        relaxation: Relaxation,
        *,
        memory: int,
        cancel: Callable[[], bool] | None = None,
        progress: Callable[[float], None] | None = None,
        hulls: Relaxation | None = None,
    ) -> RelaxedFrontier:
        """Every breakpoint (:func:`relaxed_frontier`), with the durations of some of them kept.

        The durations kept are of at most about ``memory`` bytes' worth of breakpoints (at
        least 64): a quarter the first breakpoint in each of as many equal cells of time,
        the rest spread evenly by index (breakpoints crowd where the frontier bends),
        thinned by half whenever they overflow; the slowest and the fastest always.
        ``progress`` gets the fraction of the time range swept. ``hulls`` (default
        ``relaxation``): the hulls swept, e.g. an :meth:`Relaxation.under_estimate` of
        ``relaxation`` (the bound is then its frontier's); ``relaxation`` stays the
        frontier's, for rounding.

        Memory: ``O(b + memory)`` for ``b`` breakpoints, whatever ``b`` is; time as
        :func:`relaxed_frontier`.
        """
        swept = relaxation if hulls is None else hulls
        times, costs, kept_t, kept_d = sweep_range(
            problem, swept, memory=memory, cancel=cancel, progress=progress
        )
        return cls.from_arrays(problem, relaxation, times, costs, kept_t, kept_d)

    @classmethod
    def from_arrays(
        cls,
        problem: EnergyProblem,
        relaxation: Relaxation,
        times: FloatArray,
        costs: FloatArray,
        kept_times: FloatArray,
        kept_durations: FloatArray,
    ) -> RelaxedFrontier:
        """The frontier of a whole sweep's arrays, as :func:`sweep_range` returns them."""
        dag = problem.dag
        t_min = float(dag.iteration_time(relaxation.shortest))
        if times.size and times[0] * (1 - TIME_SLACK) > t_min:
            # The sweep stopped short of the fastest time (a step that could not move, on a
            # long path where rounding adds up). G does not rise as T grows, so the cost
            # reached is a certified bound at every faster time too: a flat G down to t_min
            # instead of no bound at all. (The kept durations stay: rounding starts from the
            # last relaxed solution, a far better start than every node at its fastest.)
            times = np.r_[t_min, times]
            costs = np.r_[costs[0], costs]
        return cls(
            relaxation=relaxation,
            times=times,
            costs=costs,
            kept_times=kept_times,
            kept_durations=kept_durations,
            t_min=t_min,
            t_max=float(dag.iteration_time(relaxation.longest)),
            ranks_power=problem.blocking_power * dag.num_ranks,
        )

    def durations_at(self, deadlines: FloatArray) -> FloatArray:
        """The relaxed durations at each of ``deadlines`` (``(k, n)``).

        Interpolated between the kept solutions (the relaxed optimum between two consecutive
        breakpoints).
        """
        return interpolate_durations(self.kept_times, self.kept_durations, deadlines)

    def bound(self, times: FloatArray) -> FloatArray:
        """The certified lower bound ``G(T) + P R T`` at each of ``times``.

        ``inf`` below the fastest time; see :attr:`relaxed_bound`.
        """
        out: FloatArray = np.asarray(self.relaxed_bound.bound(times), dtype=np.float64)
        return out
