"""The one small interface every GPU backend implements.

Used by the rank client and the node daemon alike.

- **identity** (:meth:`GpuBackend.identity`): the device's index, UUID and device node
  (:class:`DeviceIdentity`; a backend that cannot tell leaves the UUID and node ``None``);
- **clocks**: the supported SM clocks (:meth:`~GpuBackend.supported_clocks`, highest first),
  lock one (:meth:`~GpuBackend.set_locked_clocks`), reset (:meth:`~GpuBackend.reset_locked_clocks`);
- **samples**: the SM clock now and the clock-event (throttle) reasons
  (:meth:`~GpuBackend.read_clock`, reason names of
  :data:`perseus_common.clocks.CLOCK_EVENT_REASONS`), the power draw (:meth:`~GpuBackend.power_w`),
  the cumulative energy counter (:meth:`~GpuBackend.energy_mj`, millijoules, like NVML's
  ``nvmlDeviceGetTotalEnergyConsumption``).

Four abstract methods (supported clocks, lock, reset, energy); the rest answer "cannot tell" by
default. A vendor's module implements them over its library and gives its
:class:`~perseus_client.gpu.vendors.GpuVendor` entry (see :mod:`perseus_client.gpu.vendors`).

The client marks each instruction on the training thread (``begin_instruction``,
``end_instruction``, ``abort_instruction``); the base tracks which one runs
(:meth:`~GpuBackend.running_instruction`, read by the applied-clock sampler), so a backend
overriding the hooks calls ``super()``. :class:`~perseus_client.gpu.simulated.SimulatedGpu` also
models the instruction's duration and energy at the clock in effect.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseus_client.gpu.applied import AppliedClockReport, Instruction

__all__ = [
    "DeviceIdentity",
    "GpuBackend",
    "GpuVendor",
    "device_minor",
    "hold_briefly",
    "RESET_LOCK_WAIT_S",
]

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


@dataclass(frozen=True)
class DeviceIdentity:
    """Which device a backend drives: its index, UUID and device node.

    Its index on the node (the vendor library's), its UUID (``GPU-...`` for NVIDIA; what the
    node daemon leases by) and its device node (``/dev/nvidia3``: what the daemon checks a
    trainer holds open); ``None``: cannot tell.
    """

    index: int
    uuid: str | None = None
    device_node: str | None = None


def device_minor(node: str | None) -> int | None:
    """The minor number a device node's name carries; ``None`` without one.

    For example ``/dev/nvidia3`` -> 3, ``/dev/dri/renderD128`` -> 128.
    """
    if not node:
        return None
    digits = len(node) - len(node.rstrip("0123456789"))
    return int(node[-digits:]) if digits else None


@dataclass(frozen=True)
class GpuVendor:
    """One vendor's entry in the registry (:mod:`perseus_client.gpu.vendors`).

    How to tell its GPUs are here and how to open them.

    ``available()`` is the availability probe: cheap, no side effect (its library importable and
    its device nodes present). ``open(index, dry_run)`` opens GPU ``index`` (``dry_run``: read
    everything, apply no clock); ``count()`` says how many GPUs the node has. Both raise a
    :class:`~perseus_client.errors.GpuError` subclass naming the cause.
    """

    name: str
    available: Callable[[], bool]
    open: Callable[[int, bool], GpuBackend]
    count: Callable[[], int]


class GpuBackend(ABC):
    """SM clock control and sampling for one GPU (see the module docstring)."""

    #: Human-readable device name (``"NVIDIA A100-SXM4-80GB"``, ``"simulated"``...).
    name: str = "gpu"
    #: True when the requested clock must be applied before ``begin_instruction`` (see module doc).
    synchronous_clocks: bool = False
    #: True when the backend samples its applied clocks itself (:meth:`take_applied_clocks`);
    #: the client then starts no sampler of its own.
    samples_itself: bool = False
    #: The instruction between begin and end (tracked here; see :meth:`running_instruction`).
    _running: Instruction | None = None

    # -- identity ---------------------------------------------------------------------------------

    def identity(self) -> DeviceIdentity:
        """The device's index, UUID and device node (default: index 0, the rest unknown)."""
        return DeviceIdentity(0)

    # -- clocks -----------------------------------------------------------------------------------

    @abstractmethod
    def supported_clocks(self) -> tuple[int, ...]:
        """Supported SM clocks in MHz, highest first."""

    @property
    def max_clock(self) -> int:
        """The highest supported SM clock in MHz."""
        return self.supported_clocks()[0]

    def max_power_limit_w(self) -> float | None:
        """The GPU's maximum power limit in watts; ``None`` (the default): this backend cannot tell.

        NVML's ``nvmlDeviceGetPowerManagementLimitConstraints``, its max; registered with
        the server as the cost policy's ``MAXPOWER``.
        """
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

    # -- samples ----------------------------------------------------------------------------------

    @abstractmethod
    def energy_mj(self) -> int:
        """The cumulative energy counter in millijoules (only differences are meaningful)."""

    def read_clock(self) -> tuple[int, frozenset[str]] | None:
        """The SM clock (MHz) the GPU runs at now and the names of its clock-event reasons.

        The reasons are names such as ``sw_power_cap``, ``hw_thermal_slowdown``; ``None``
        (the default): cannot tell. Read-only, whatever the backend's mode.
        """
        return None

    def power_w(self) -> float | None:
        """The power draw now, watts; ``None`` (the default): cannot tell."""
        return None

    def timestamp(self) -> float:
        """Seconds on the device's time axis (wall time for real GPUs; simulated time otherwise)."""
        return time.perf_counter()

    # -- instructions -----------------------------------------------------------------------------

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:
        """Called on the training thread when an instruction starts."""
        self._running = (kind, microbatch, stage)

    def end_instruction(self) -> None:
        """Called on the training thread when an instruction's body returns."""
        self._running = None

    def abort_instruction(self) -> None:
        """Called instead of :meth:`end_instruction` when the instruction's body raised."""
        self._running = None

    def running_instruction(self) -> Instruction | None:
        """The instruction between ``begin_instruction`` and its end (``None``: none).

        Read from the sampler thread.
        """
        return self._running

    # -- applied clocks -----------------------------------------------------------------------------

    def sample_applied_clock(self) -> tuple[int, frozenset[str]] | None:
        """What the applied-clock sampler compares with the lock: :meth:`read_clock` by default.

        ``None``: nothing to verify, e.g. a backend that never applies a lock.

        Called from the client's sampler thread, never from the training thread; read-only.
        """
        return self.read_clock()

    def take_applied_clocks(self) -> AppliedClockReport | None:
        """The applied clocks seen since the previous call, for backends that sample them.

        For backends that sample their applied clocks themselves.

        ``None`` (the default): the client samples, or nobody does.
        """
        return None

    # -- power floors -------------------------------------------------------------------------------

    def floor_unavailable(self) -> str | None:
        """Why this GPU cannot hold a power floor; None when it can."""
        return "this GPU backend cannot hold a power floor"

    def set_power_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> bool:
        """Draw at least ``watts`` from now on (0: no floor); False when it cannot.

        ``ramp_w_per_s``: the rate at which the floor may move, up and down (W/s; 0: the
        GPU's own). Called from the client's floor thread (:mod:`perseus_client.gpu.floors`), never from
        the training thread.
        """
        return False

    def release_power_floor(self) -> bool:
        """Release a floor whoever set it (the node daemon's recovery after a crash).

        Returns whether there was a way to (False: this backend holds no floors).
        """
        return False

    def synchronize(self) -> None:  # noqa: B027
        """Wait for the device's queued work (used around measured instructions while profiling)."""

    def close(self) -> None:  # noqa: B027
        """Release the backend's resources (does not reset clocks; the client does that)."""
