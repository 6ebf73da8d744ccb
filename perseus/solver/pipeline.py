"""The sweep and the rounding overlapped: deadlines rounded once the sweep has passed them.

The relaxed sweep goes from the slowest time ``t_max`` down to the fastest ``t_min`` on one core,
and the rounding of a deadline ``T`` needs only what the sweep has found above ``T``: the bound
(``G`` is exact down to the sweep's last breakpoint) and the relaxed durations kept around
``T``. So the time range is cut into :data:`SEGMENTS` windows (at ``t_min + (t_max - t_min)
(r / S)^2``, narrower towards ``t_min`` where breakpoints crowd), the sweep runs on a thread of
its own, and as soon as it has passed a window's lower end (and kept a row at or below it) the
window is worked on while the sweep goes on: its breakpoints rounded (``initial_candidates / S``
of them, spread by index), then rounds of splitting its intervals peaking highest and
randomised roundings of its hard ones (``refine_batch / S`` and ``hard_intervals / S`` a round),
every plan kept in the solve's one :class:`~perseus.solver.candidates.CandidatePool`. The
fastest window is worked on once the sweep has ended; then the whole frontier is refined,
searched and polished as without the pipeline, from a pool that already holds the windows'
plans (so those rounds stop early: their mean gap no longer falls).

Deterministic: a window is handed over at the end of the first chunk of steps (a fixed number
of steps) that passes it, with the breakpoints and kept rows of that moment, and windows are
worked on in order on the solving thread with the solve's one seeded generator; how fast either
thread runs changes nothing. From :data:`PIPELINE_MIN_NODES` nodes (smaller sweeps take a
second or less, and their frontiers stay what they were), with the sweep core, one relaxation
(no per-clock transfers) and no range sweep. Wall time on two cores: about the sweep's, plus the
fastest window's work and the global rounds, instead of the sweep's plus all the rounding's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from perseus.problem import EnergyProblem
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.relaxation import Relaxation, SweptSoFar, sweep_range

__all__ = ["PIPELINE_MIN_NODES", "SEGMENTS", "Window", "SweepStats", "window_cuts", "overlapped"]

#: From this many DAG nodes a solve overlaps its sweep with the rounding.
PIPELINE_MIN_NODES = 4096
#: Windows the time range is cut into.
SEGMENTS = 8


@dataclass(frozen=True, eq=False)
class Window:
    """A window of deadlines ``[lo, hi]`` the sweep has passed, and its frontier of that moment.

    ``relaxed`` holds every breakpoint found so far (the bound is exact down to below ``lo``)
    and the durations kept from the last one at or below ``lo`` to the first at or above
    ``hi`` (a copy: memory in proportion to the window); ``share`` is the
    window's part of the per-round work (``1 / SEGMENTS``).
    """

    lo: float
    hi: float
    relaxed: RelaxedFrontier
    share: float
    #: whether the sweep still runs (every window but the fastest)
    during_sweep: bool = True


@dataclass
class SweepStats:
    """The sweeping thread's wall and CPU seconds, and the windows handed over before it ended."""

    wall: float = 0.0
    cpu: float = 0.0
    early_windows: int = 0


def window_cuts(t_min: float, t_max: float, segments: int = SEGMENTS) -> list[float]:
    """The windows' lower ends, by decreasing time: ``t_min + (t_max - t_min)(r / S)^2``, ``t_min``."""
    span = t_max - t_min
    return [t_min + span * (r / segments) ** 2 for r in range(segments - 1, 0, -1)] + [t_min]


class _Handover:
    """Called after each chunk of the sweep: hands each passed window to the solving thread."""

    def __init__(
        self,
        relaxed_of: Callable[[SweptSoFar, float, float], RelaxedFrontier],
        cuts: list[float],
        t_max: float,
    ) -> None:
        self.relaxed_of = relaxed_of
        self.cuts = cuts
        self.next = 0
        self.hi = t_max
        self.out: queue.Queue[Window | BaseException | None] = queue.Queue()

    def __call__(self, so_far: SweptSoFar) -> None:
        while self.next < len(self.cuts) - 1 and not so_far.done:
            lo = self.cuts[self.next]
            if so_far.position > lo:
                return
            rf = self.relaxed_of(so_far, lo, self.hi)
            if rf.kept_times[0] > lo:
                return  # no row at or below lo kept yet: wait for the next chunk
            self.out.put(Window(lo, self.hi, rf, 1.0 / len(self.cuts)))
            self.hi = lo
            self.next += 1


def overlapped(
    problem: EnergyProblem,
    relaxation: Relaxation,
    work: Callable[[Window], None],
    *,
    memory: int,
    cancel: Callable[[], bool] | None = None,
    progress: Callable[[float], None] | None = None,
    hulls: Relaxation | None = None,
    stats: SweepStats | None = None,
) -> RelaxedFrontier:
    """The relaxed frontier (as :meth:`RelaxedFrontier.sweep`), with ``work`` done meanwhile.

    The sweep runs on a thread of its own; ``work`` runs here on every window of deadlines, in
    order from the slowest, as soon as the sweep has passed it (the fastest window once the
    sweep has ended, on the final frontier). A failure or a cancel on either side stops both;
    the first exception raised propagates.
    """
    swept = relaxation if hulls is None else hulls
    dag = problem.dag
    t_min = float(dag.iteration_time(relaxation.shortest))
    t_max = float(dag.iteration_time(relaxation.longest))
    pr = problem.blocking_power * dag.num_ranks

    def relaxed_of(so_far: SweptSoFar, lo: float, hi: float) -> RelaxedFrontier:
        t, c, kt, kd = so_far.arrays(lo, hi)
        return RelaxedFrontier(relaxation, t, c, kt, kd, t_min, t_max, pr)

    cuts = window_cuts(t_min, t_max) if t_max > t_min else [t_min]
    handover = _Handover(relaxed_of, cuts, t_max)
    failed = threading.Event()

    def stop() -> bool:
        return failed.is_set() or (cancel is not None and cancel())

    result: list[RelaxedFrontier] = []

    def sweep() -> None:
        w, c = time.perf_counter(), time.thread_time()
        try:
            arrays = sweep_range(
                problem, swept, memory=memory, cancel=stop, progress=progress, on_chunk=handover
            )
            result.append(RelaxedFrontier.from_arrays(problem, relaxation, *arrays))
            handover.out.put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the solving thread
            handover.out.put(exc)
        finally:
            if stats is not None:
                stats.wall, stats.cpu = time.perf_counter() - w, time.thread_time() - c

    thread = threading.Thread(target=sweep, name="perseus-sweep", daemon=True)
    thread.start()
    try:
        early = _work_while_sweeping(handover, work)
    except BaseException:
        failed.set()
        thread.join()
        raise
    thread.join()
    final = result[0]
    if stats is not None:
        stats.early_windows = early
    lo = handover.cuts[-1]
    share = (len(handover.cuts) - handover.next) / len(handover.cuts)
    work(Window(lo, handover.hi, final, share, during_sweep=False))
    return final


def _work_while_sweeping(handover: _Handover, work: Callable[[Window], None]) -> int:
    """``work`` on every window the sweep hands over until it ends; how many there were."""
    done = 0
    while True:
        item = handover.out.get()
        if item is None:
            return done
        if isinstance(item, BaseException):
            raise item
        work(item)
        done += 1
