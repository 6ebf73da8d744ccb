"""Applied-clock verification: is the clock a GPU runs at the clock that was locked for it?

A lock can be overridden: power or thermal throttling, a hardware slowdown, a driver that accepts
a lock and applies another clock. So while an instruction runs, its GPU's SM clock and NVML's
clock-event (throttle) reasons are *sampled* off the training thread, and each sample is compared
with the clock locked at that moment.

**The off-plan rule.** A sample is off-plan when its SM clock is more than one supported step
below the locked clock (:func:`steps_below` > :data:`TOLERANCE_STEPS`): a clock between two
supported ones counts as the nearest, and one step of tolerance absorbs a GPU that settles a step
below its lock under load. A clock above the lock is never off-plan (the instruction ran no
slower than planned). Samples whose reasons include ``gpu_idle`` are skipped: the GPU sat between
kernels and its clock says nothing about the instruction. An instruction is off-plan when one of
its samples is; it is reported once per locked clock, with the lowest clock sampled, the reasons
seen in its off-plan samples and their number.

Two ways to sample:

- :class:`ClockSampler`, a low-rate thread of the client's own for backends that can be read from
  another thread (:meth:`GpuBackend.sample_applied_clock`: :class:`NvmlGpu`, :class:`SimulatedGpu`);
- :class:`~perseus_client.gpu.daemon.DaemonGpu` samples through the node daemon on its heartbeat
  thread.

**Changes in flight are not sampled.** A lock change takes the backend milliseconds (an NVML
call), and the GPU ramps for a while after it. The controller publishes its lock as a
:class:`LockState` snapshot with a change counter (a seqlock: odd while a backend set/reset is in
flight) and the time the last change completed; the sampler reads the snapshot before and after
its NVML read and discards the sample when a change was in flight, one happened meanwhile, or the
last one completed less than :data:`SETTLE_S` ago. Otherwise the old lock would be compared with
the new clock and a lowered lock would count as off-plan. The snapshot also names the instruction
the lock was requested for (on real GPUs the lock is applied after the previous instruction's
CUDA event, so it belongs to the instruction the GPU runs, which may lag the one the CPU issues);
the sample is attributed to it, else to the backend's ``running_instruction()``.

Both feed an :class:`AppliedClockTally`; the client takes it once per iteration (one lock and
two swaps on the training thread) and sends it with the iteration's report. On real GPUs the CPU
side of an instruction runs ahead of the GPU, so attributing a sample to an instruction is
approximate; the comparison with the lock in effect is exact. Cost: each sample is one
``sample_applied_clock`` call (two NVML reads) plus a dict update, once per ``interval``.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from perseus_common.wire.values import OffPlanReport

if TYPE_CHECKING:
    from perseus_client.gpu.base import GpuBackend

__all__ = [
    "AppliedClockReport",
    "AppliedClockTally",
    "ClockSampler",
    "Instruction",
    "LockState",
    "OffPlanInstruction",
    "SETTLE_S",
    "TOLERANCE_STEPS",
    "fixed_lock",
    "is_off_plan",
    "steps_below",
]

log = logging.getLogger("perseus_client.gpu.applied")

#: ``(kind, microbatch, stage)`` of the instruction running (stage ``None``: the rank's own).
Instruction = tuple[str, int, "int | None"]

#: Supported-clock steps below its lock a sample may run and still be on plan.
TOLERANCE_STEPS = 1

#: Seconds after a lock change completes before samples count (the GPU ramps to its new clock).
SETTLE_S = 0.020


class LockState(NamedTuple):
    """One consistent view of the frequency controller's lock (see the module docstring).

    ``generation`` is odd while a backend change is in flight and changes with every change;
    ``mhz`` the clock locked (``None``: reset or unknown); ``settled_at`` the
    :func:`time.monotonic` time the last change completed; ``instruction`` the instruction the lock
    was requested for (``None``: not known).
    """

    generation: int
    mhz: int | None
    settled_at: float
    instruction: Instruction | None


def fixed_lock(mhz: int | None) -> Callable[[], LockState]:
    """A :class:`LockState` callable that always answers ``mhz``, settled long ago.

    A lock that never changes: tests, a backend locked once by hand.
    """
    state = LockState(0, mhz, float("-inf"), None)
    return lambda: state


def _position(ascending: Sequence[int], mhz: int) -> int:
    i = bisect.bisect_left(ascending, mhz)
    if i == len(ascending) or (i > 0 and mhz - ascending[i - 1] < ascending[i] - mhz):
        i -= 1
    return i


def steps_below(ascending: Sequence[int], locked: int, sampled: int) -> int:
    """How many supported clocks (``ascending``, increasing) ``sampled`` lies below ``locked``.

    Each clock counts as the nearest supported one; 0 when ``sampled`` is at or above ``locked``.
    O(log n).
    """
    if sampled >= locked or not ascending:
        return 0
    return max(0, _position(ascending, locked) - _position(ascending, sampled))


def is_off_plan(ascending: Sequence[int], locked: int, sampled: int) -> bool:
    """The off-plan rule: more than :data:`TOLERANCE_STEPS` supported steps below the lock."""
    return steps_below(ascending, locked, sampled) > TOLERANCE_STEPS


OffPlanInstruction = OffPlanReport
"""An instruction during which the GPU ran more than one step below its locked clock: the
wire's :class:`~perseus_common.wire.OffPlanReport` (``instruction``, ``microbatch``, ``stage``,
``locked_mhz``, ``sampled_mhz`` the lowest clock sampled, ``reasons`` the NVML clock-event
reasons seen in its off-plan samples (sorted), ``samples`` their number)."""


@dataclass(frozen=True)
class AppliedClockReport:
    """What the applied-clock samples showed since the previous report."""

    #: Samples taken while an instruction ran with a lock in effect.
    samples: int
    #: The instructions that ran off-plan, in the order first seen.
    off_plan: tuple[OffPlanReport, ...]
    #: Every clock-event reason seen in those samples, sorted.
    reasons: tuple[str, ...]


EMPTY_REPORT = AppliedClockReport(0, (), ())


@dataclass
class _Tally:
    sampled_mhz: int
    reasons: set[str]
    samples: int


class AppliedClockTally:
    """Samples since the last :meth:`take`, against the GPU's supported clocks (thread-safe)."""

    def __init__(self, supported_clocks: Iterable[int]) -> None:
        self._ascending = sorted({int(c) for c in supported_clocks})
        self._lock = threading.Lock()
        self._samples = 0
        self._reasons: set[str] = set()
        self._off_plan: dict[tuple[Instruction, int], _Tally] = {}

    def record(
        self, instruction: Instruction, locked: int, sampled: int, reasons: Iterable[str]
    ) -> bool:
        """One sample taken while ``instruction`` ran; returns whether it counted as off-plan.

        ``locked`` was in effect meanwhile; ``gpu_idle`` samples are skipped: see the module
        docstring.
        """
        names = frozenset(reasons)
        if "gpu_idle" in names:
            return False
        off = is_off_plan(self._ascending, locked, sampled)
        with self._lock:
            self._samples += 1
            self._reasons.update(names)
            if not off:
                return False
            key = (instruction, locked)
            tally = self._off_plan.get(key)
            if tally is None:
                self._off_plan[key] = _Tally(sampled, set(names), 1)
            else:
                tally.sampled_mhz = min(tally.sampled_mhz, sampled)
                tally.reasons.update(names)
                tally.samples += 1
        return True

    def take(self) -> AppliedClockReport:
        """What was recorded since the previous call (and start afresh)."""
        with self._lock:
            if not self._samples:
                return EMPTY_REPORT
            off_plan, self._off_plan = self._off_plan, {}
            samples, self._samples = self._samples, 0
            reasons, self._reasons = self._reasons, set()
        return AppliedClockReport(
            samples,
            tuple(
                OffPlanReport(
                    kind, mb, stage, locked, t.sampled_mhz, tuple(sorted(t.reasons)), t.samples
                )
                for ((kind, mb, stage), locked), t in off_plan.items()
            ),
            tuple(sorted(reasons)),
        )


class ClockSampler:
    """A daemon thread that samples ``gpu``'s applied clock every ``interval`` seconds.

    A sample is taken only while an instruction runs (``gpu.running_instruction()``) and a lock
    is in effect and settled (``locked()``, the frequency controller's :class:`LockState`, read
    before and after the reading; ``settle`` seconds after a change); it reads
    ``gpu.sample_applied_clock()`` and records it in :attr:`tally` against the snapshot's
    instruction (else the running one). The training thread does no
    sampling work. A backend error stops nothing: it is logged once and sampling goes on.
    """

    def __init__(
        self,
        gpu: GpuBackend,
        locked: Callable[[], LockState],
        *,
        interval: float = 0.05,
        settle: float = SETTLE_S,
        name: str = "perseus-clock-sampler",
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval: must be > 0 seconds, got {interval}")
        if not settle >= 0:
            raise ValueError(f"settle: must be >= 0 seconds, got {settle}")
        self.gpu = gpu
        self.interval = float(interval)
        self.settle = float(settle)
        self.tally = AppliedClockTally(gpu.supported_clocks())
        self._locked = locked
        self._stop = threading.Event()
        self._error_logged = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def for_backend(
        cls, gpu: GpuBackend, locked: Callable[[], LockState], interval: float
    ) -> ClockSampler | None:
        """A sampler for ``gpu``, or ``None`` when there is nothing to sample.

        Nothing to sample: ``interval`` is 0, the backend samples itself
        (:attr:`GpuBackend.samples_itself`; its tally is not touched) or cannot be read
        (:meth:`GpuBackend.sample_applied_clock` answers ``None`` or fails).
        """
        if interval <= 0 or gpu.samples_itself:
            return None
        try:
            if gpu.sample_applied_clock() is None:
                return None
        except Exception as exc:  # noqa: BLE001 - verification never fails training
            log.warning("perseus: applied clocks are not verified (cannot read them): %s", exc)
            return None
        return cls(gpu, locked, interval=interval)

    def sample(self) -> bool:
        """Take one sample now; returns whether a sample was recorded.

        The thread's step; tests call it directly.
        """
        before = self._locked()
        locked = before.mhz
        if locked is None or before.generation % 2:
            return False  # no lock, or a change in flight
        if time.monotonic() - before.settled_at < self.settle:
            return False  # the GPU may still be ramping to the new lock
        running = self.gpu.running_instruction()
        if running is None:
            return False
        try:
            reading = self.gpu.sample_applied_clock()
        except Exception as exc:  # noqa: BLE001 - verification never fails training
            if not self._error_logged:
                self._error_logged = True
                log.warning("perseus: could not sample the applied clock: %s", exc)
            return False
        if reading is None:
            return False
        if self._locked().generation != before.generation:
            return False  # the lock changed while reading: the pair is not consistent
        if self.gpu.running_instruction() != running:
            return False  # the instruction ended while reading: attribute nothing
        instruction = before.instruction if before.instruction is not None else running
        self.tally.record(instruction, locked, reading[0], reading[1])
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def take(self) -> AppliedClockReport:
        """The tally since the previous call, and start a new one."""
        return self.tally.take()

    def close(self) -> None:
        """Stop the sampler thread (waits up to a second unless called from it)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
