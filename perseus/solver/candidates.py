"""Every distinct plan a solve has found, with its true time and energy.

Also what the plans say about where the frontier is still far from the bound.

A :class:`CandidatePool` keeps each plan once, evaluated exactly from the measurements
(:meth:`~perseus.problem.EnergyProblem.evaluate_many`), and runs batches of plan-making work over
a thread pool (the kernels release the GIL). :meth:`CandidatePool.snapshot` gives the Pareto set
of what was found and, for each of its plans, the interval until the next one and the gap to
the bound at that interval's peak: just before the next plan's time, where this plan plus
waiting is still the best.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.errors import SolverCancelled
from perseus.problem import EnergyProblem
from perseus.solver.breakpoints import RelaxedFrontier

__all__ = ["CandidatePool", "Snapshot", "pareto"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
PlanArray = npt.NDArray[np.uint8]


def pareto(times: FloatArray, waiting: FloatArray) -> IntArray:
    """Indices, by increasing time, of the points with strictly decreasing ``waiting``.

    ``waiting`` is ``energy - P R time``: what a plan costs at any later deadline, less a
    constant.
    """
    keep = []
    best = np.inf
    for i in np.lexsort((waiting, times)):
        if waiting[i] < best - 1e-9 * abs(waiting[i]):
            keep.append(i)
            best = waiting[i]
    return np.asarray(keep, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The candidates at one moment.

    Attributes:
        plans, times, energies: every plan found (``(k, n)``) and its true time and energy.
        keep: indices of the Pareto plans, by increasing time.
        kept_times, kept_waiting: their times and ``energy - P R time``.
        ends: where each Pareto plan's interval ends (the next plan's time; the last plan's
            interval reaches the relaxed frontier's slowest time, if it is faster).
        peak: the relative gap to the bound at each interval's end.
    """

    plans: PlanArray
    times: FloatArray
    energies: FloatArray
    keep: IntArray
    kept_times: FloatArray
    kept_waiting: FloatArray
    ends: FloatArray
    peak: FloatArray

    def worst(self, count: int, above: float) -> IntArray:
        """Positions (in ``keep``) of up to ``count`` intervals with the highest peaks.

        Only those above ``above``.
        """
        chosen = np.argsort(-self.peak, kind="stable")[:count]
        out: IntArray = chosen[self.peak[chosen] > above]
        return out

    def middles(self, chosen: IntArray) -> FloatArray:
        """The middle of each ``chosen`` interval."""
        out: FloatArray = (self.kept_times[chosen] + self.ends[chosen]) / 2
        return out

    def kept_plans(self, chosen: IntArray) -> PlanArray:
        """The plans of the ``chosen`` intervals."""
        return self.plans[self.keep[chosen]]


class CandidatePool:
    """Distinct plans found so far, and a thread pool to find more.

    A context manager: the threads stop on exit.

    ``cancel`` is polled before every batch; returning ``True`` raises
    :class:`~perseus.errors.SolverCancelled`.
    """

    def __init__(
        self,
        problem: EnergyProblem,
        relaxed: RelaxedFrontier | None,
        cancel: Callable[[], bool] | None = None,
        threads: int | None = None,
    ) -> None:
        self.problem = problem
        self.relaxed = relaxed
        self.cancel = cancel
        self.threads = max(1, min(8, threads or os.cpu_count() or 1))
        self.pool = ThreadPoolExecutor(max_workers=self.threads)
        self._seen: set[bytes] = set()
        self._plans: list[PlanArray] = []
        self._times: list[FloatArray] = []
        self._energies: list[FloatArray] = []

    def __enter__(self) -> CandidatePool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.pool.shutdown()

    def check_cancel(self) -> None:
        """Raise :class:`~perseus.errors.SolverCancelled` if the caller asks to stop."""
        if self.cancel is not None and self.cancel():
            raise SolverCancelled("frontier computation cancelled")

    def add(self, plans: PlanArray) -> None:
        """Keep the plans not seen before, each with its true time and energy."""
        fresh = []
        for plan in plans:
            key = plan.tobytes()
            if key not in self._seen:
                self._seen.add(key)
                fresh.append(plan)
        if fresh:
            new = np.stack(fresh)
            t, e = self.problem.evaluate_many(new)
            self._plans.append(new)
            self._times.append(t)
            self._energies.append(e)

    def batched(self, fn: Callable[..., PlanArray], *arrays: Any) -> None:
        """Run ``fn`` on rows of ``arrays`` over the threads, and add every plan it returns.

        The rows are split over the threads, each part in one call.
        """
        self.check_cancel()
        parts = np.array_split(np.arange(len(arrays[0])), min(self.threads, len(arrays[0])))
        for plans in self.pool.map(lambda rows: fn(*(a[rows] for a in arrays)), parts):
            self.add(plans)

    def map(self, fn: Callable[..., PlanArray], *iterables: Any) -> list[PlanArray]:
        """Run ``fn`` on the threads, one call per item of ``iterables``; results in order.

        The iterables are taken in step; nothing is added.
        """
        return list(self.pool.map(fn, *iterables))

    def snapshot(self) -> Snapshot:
        """The plans found so far, their Pareto set and each Pareto plan's interval."""
        rf = self.relaxed
        if rf is None:
            raise RuntimeError("snapshot: no relaxed frontier yet (set CandidatePool.relaxed)")
        pr = rf.ranks_power
        allp = np.concatenate(self._plans)
        times, energies = np.concatenate(self._times), np.concatenate(self._energies)
        keep = pareto(times, energies - pr * times)
        kt, kw = times[keep], (energies - pr * times)[keep]
        ends = np.r_[kt[1:], rf.t_max] if kt[-1] < rf.t_max else kt[1:]
        peak = (kw[: len(ends)] + pr * ends) / rf.bound(ends) - 1
        return Snapshot(allp, times, energies, keep, kt, kw, ends, peak)
