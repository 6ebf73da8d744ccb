"""The one small interface every GPU backend implements.

A backend knows the GPU's supported SM clocks, locks and resets the SM clock, and reads the
GPU's cumulative energy counter (millijoules, like NVML's ``nvmlDeviceGetTotalEnergyConsumption``).

Two optional hooks let a backend take part in instruction execution: ``begin_instruction`` and
``end_instruction`` are called by the client on the training thread around each instruction.
Real GPUs ignore them; :class:`~perseus_client.gpu.simulated.SimulatedGpu` uses them to model
the instruction's duration and energy at the clock in effect.

``synchronous_clocks`` tells the client that the clock requested for an instruction must be in
effect *before* ``begin_instruction`` runs (simulated and recording backends: the clock decides
the modelled duration, and tests check it). For real GPUs the frequency controller applies the
clock off the training thread and the training thread never waits for it.

**Resets are safe to call concurrently.** ``reset_locked_clocks`` is also the emergency path: the
client calls it from a signal handler (which may have interrupted this backend on the same
thread) while the frequency controller's thread may be inside ``set_locked_clocks`` or stuck on a
CUDA event. So a backend's reset waits at most briefly for its own lock (:func:`hold_briefly`)
and then goes ahead without it; the controller undoes a lock that lands after a reset.

**Applied clocks** (optional, read-only; see :mod:`perseus_client.gpu.applied`). A backend whose
``sample_applied_clock`` answers (the SM clock it runs at now and NVML's clock-event reason
names) and whose ``running_instruction`` tells the instruction between ``begin_instruction`` and
``end_instruction`` is sampled by the client's :class:`~perseus_client.gpu.applied.ClockSampler`
thread. A backend that samples itself (the node daemon's) answers ``take_applied_clocks``
instead. Both default to "cannot tell": the client then reports no samples.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseus_client.gpu.applied import AppliedClockReport, Instruction

__all__ = ["GpuBackend", "hold_briefly", "RESET_LOCK_WAIT_S"]

#: Seconds a reset waits for a backend's own lock before it goes ahead without it.
RESET_LOCK_WAIT_S = 0.25


@contextmanager
def hold_briefly(
    lock: threading.Lock | threading.RLock, timeout: float = RESET_LOCK_WAIT_S
) -> Iterator[bool]:
    """Hold ``lock`` if it can be had within ``timeout`` seconds; yield whether it is held.

    Used by resets (see the module docstring): a thread stuck while holding the lock, or a
    non-reentrant lock held by the very thread a signal handler interrupted, delays the reset by
    at most ``timeout`` instead of forever.
    """
    held = lock.acquire(timeout=timeout)
    try:
        yield held
    finally:
        if held:
            lock.release()


class GpuBackend(ABC):
    """SM clock control and energy reading for one GPU."""

    #: Human-readable device name (``"NVIDIA A100-SXM4-80GB"``, ``"simulated"``...).
    name: str = "gpu"
    #: True when the requested clock must be applied before ``begin_instruction`` (see module doc).
    synchronous_clocks: bool = False
    #: True when the backend samples its applied clocks itself (:meth:`take_applied_clocks`);
    #: the client then starts no sampler of its own.
    samples_itself: bool = False

    @abstractmethod
    def supported_clocks(self) -> tuple[int, ...]:
        """Supported SM clocks in MHz, highest first."""

    @property
    def max_clock(self) -> int:
        """The highest supported SM clock in MHz."""
        return self.supported_clocks()[0]

    def max_power_limit_w(self) -> float | None:
        """The GPU's maximum power limit in watts (NVML's
        ``nvmlDeviceGetPowerManagementLimitConstraints``, its max), registered with the server as
        the cost policy's ``MAXPOWER``; ``None`` (the default): this backend cannot tell."""
        return None

    @abstractmethod
    def set_locked_clocks(self, mhz: int) -> None:
        """Lock the SM clock at ``mhz`` (must be one of :meth:`supported_clocks`)."""

    @abstractmethod
    def reset_locked_clocks(self) -> None:
        """Remove any SM clock lock (the GPU returns to its default clock management).

        Must be safe to call concurrently with :meth:`set_locked_clocks` and from a signal
        handler: wait at most briefly for any lock another thread may hold (module docstring).
        """

    @abstractmethod
    def energy_mj(self) -> int:
        """The cumulative energy counter in millijoules (only differences are meaningful)."""

    def timestamp(self) -> float:
        """Seconds on the device's time axis (wall time for real GPUs; simulated time otherwise)."""
        return time.perf_counter()

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:  # noqa: B027
        """Called on the training thread when an instruction starts (no-op for real GPUs)."""

    def end_instruction(self) -> None:  # noqa: B027
        """Called on the training thread when an instruction's body returns (no-op for real GPUs)."""

    def abort_instruction(self) -> None:  # noqa: B027
        """Called instead of :meth:`end_instruction` when the instruction's body raised."""

    def sample_applied_clock(self) -> tuple[int, frozenset[str]] | None:
        """The SM clock (MHz) the GPU runs at now and the names of NVML's clock-event reasons
        (``sw_power_cap``, ``hw_thermal_slowdown``, ...); ``None``: this backend cannot tell.

        Called from the client's sampler thread, never from the training thread; read-only.
        """
        return None

    def running_instruction(self) -> Instruction | None:
        """The instruction between ``begin_instruction`` and ``end_instruction`` (``None``: none,
        or this backend does not track it); read from the sampler thread."""
        return None

    def take_applied_clocks(self) -> AppliedClockReport | None:
        """For backends that sample their applied clocks themselves: what was seen since the
        previous call; ``None`` (the default): the client samples, or nobody does."""
        return None

    def synchronize(self) -> None:  # noqa: B027
        """Wait for the device's queued work (used around measured instructions while profiling)."""

    def close(self) -> None:  # noqa: B027
        """Release the backend's resources (does not reset clocks; the client does that)."""
