"""The daemon's device layer: the GPUs it manages and the only operations it performs.

:func:`open_devices` opens the managed GPUs through a vendor's registry entry
(:class:`~perseus_client.gpu.base.GpuVendor`); :func:`open_gpus` through the vendor the
availability probe finds, or through NVML on a given ``pynvml``-like module
(:class:`~perseus_gpud.simnvml.SimulatedNvml` with ``--simulate``). :class:`ManagedGpu` exposes exactly what the protocol allows, through the
backend interface (:class:`~perseus_client.gpu.base.GpuBackend`) only: lock the SM clock at a
supported value, reset it, read the supported clocks, the energy counter, the current SM clock
and the clock-event reasons, hold a power floor (NVML power smoothing, where the GPU has
it); for the daemon itself (ownership, metrics) the UUID, the device
node's minor number and the power draw. No other device call is reachable from a client.

With a :class:`~perseus_gpud.lockrecord.LockRecord`, a lock is recorded before the
backend applies it and forgotten after it reset it (the record says what to reset after a crash).

Each GPU has a single worker thread: device calls block (a lock takes milliseconds, and a sick
driver may take much longer), so the asyncio server hands them to the GPU's worker and keeps
serving heartbeats and other GPUs meanwhile; one worker per GPU keeps that GPU's operations in
order.

With ``read_only`` the GPUs are opened in ``dry_run``: locks and resets are logged and recorded
in :attr:`ManagedGpu.would`, never applied.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from perseus_client.errors import GpuError, UnsupportedClockError
from perseus_client.gpu.base import GpuBackend, GpuVendor, device_minor
from perseus_common.clocks import reason_mask, reason_names
from perseus_gpud.lockrecord import LockRecord

__all__ = ["ManagedGpu", "open_devices", "open_gpus"]

log = logging.getLogger("perseus_gpud")


class ManagedGpu:
    """One GPU the daemon manages (see the module docstring).

    Its methods block (run them in :attr:`worker`).
    """

    def __init__(
        self, gpu: GpuBackend, *, read_only: bool, record: LockRecord | None = None
    ) -> None:
        self.gpu = gpu
        ident = gpu.identity()
        self.index = ident.index
        self.name = gpu.name
        self.clocks = gpu.supported_clocks()
        #: The maximum power limit (W; 0: unknown), sent with the GPU's info.
        self.max_power_limit_w = gpu.max_power_limit_w() or 0.0
        self.read_only = read_only
        self.record = record
        minor = device_minor(ident.device_node)
        if not ident.uuid or minor is None:
            raise GpuError(
                f"GPU {ident.index} ({gpu.name}): its backend tells no UUID or device node, "
                "which leases and the ownership check need"
            )
        #: The GPU's UUID (``GPU-...``), the name leases use.
        self.uuid = ident.uuid
        #: The minor number of its device node (``/dev/nvidia<minor>``).
        self.minor = minor
        #: The SM clock this daemon locked (``None``: not locked, or read-only).
        self.locked_mhz: int | None = None
        #: In read-only mode, what the daemon would have done: ``("set", mhz)`` / ``("reset", None)``.
        self.would: list[tuple[str, int | None]] = []
        #: Why the GPU cannot hold a power floor (None: it can; read-only: never applied).
        self.floor_unavailable: str | None = gpu.floor_unavailable()
        #: The power floor this daemon holds on the GPU now (W; 0: none).
        self.floor_w = 0.0
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gpud-gpu{self.index}")

    def lock(self, mhz: int) -> bool:
        """Lock the SM clock at ``mhz``; return whether it was applied (False: read-only)."""
        if mhz not in self.clocks:
            raise UnsupportedClockError(
                f"{mhz} MHz is not a supported SM clock of GPU {self.index} ({self.name}); "
                f"supported: {', '.join(map(str, self.clocks))} MHz"
            )
        if self.record is not None and not self.read_only:
            self.record.set(self.uuid, mhz)
        self.gpu.set_locked_clocks(mhz)
        if self.read_only:
            self.would.append(("set", mhz))
            return False
        self.locked_mhz = mhz
        return True

    def reset(self, forget: bool = True) -> bool:
        """Remove the SM clock lock; return whether it was applied (False: read-only).

        ``forget``: also drop the GPU from the lock record (at the end of a lease; a reset
        within a lease keeps it, so the next lock writes nothing).
        """
        self.gpu.reset_locked_clocks()
        if self.read_only:
            self.would.append(("reset", None))
            return False
        self.locked_mhz = None
        if self.record is not None and forget:
            self.record.forget(self.uuid)
        return True

    def set_power_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> bool:
        """Hold ``watts`` (0: release); whether it was applied (False: read-only or cannot).

        Raises :class:`~perseus_client.errors.GpuError` for a floor outside 0 .. the power
        limit, or a rate that is not a finite number >= 0.
        """
        limit = self.max_power_limit_w or float("inf")
        if not (0 <= watts <= limit):
            raise GpuError(
                f"power floor: {watts!r} W is outside 0..{limit:g} W, GPU {self.index}'s power "
                "limit"
            )
        if not (ramp_w_per_s >= 0 and ramp_w_per_s < float("inf")):
            raise GpuError(f"ramp_w_per_s: must be a finite number >= 0, got {ramp_w_per_s!r}")
        if self.read_only or self.floor_unavailable is not None:
            return False
        if watts > 0 and self.record is not None:
            self.record.set_floor(self.uuid, watts)
        applied = bool(self.gpu.set_power_floor(watts, ramp_w_per_s))
        if applied:
            self.floor_w = float(watts)
        if (watts <= 0 or not applied) and self.record is not None and self.floor_w <= 0:
            self.record.forget_floor(self.uuid)
        return applied

    def release_floor(self) -> bool:
        """Release a floor this daemon holds (at a lease's end, at stop); whether one was."""
        if self.floor_w <= 0:
            return False
        self.gpu.set_power_floor(0.0)
        self.floor_w = 0.0
        if self.record is not None:
            self.record.forget_floor(self.uuid)
        return True

    def release_recorded_floor(self) -> bool:
        """Release a floor the lock record says an earlier run of the daemon left (at start)."""
        released = bool(self.gpu.release_power_floor())
        if self.record is not None:
            self.record.forget_floor(self.uuid)
        return released

    def power_w(self) -> float:
        """The power draw now, watts (0: the backend cannot tell)."""
        return self.gpu.power_w() or 0.0

    def energy_mj(self) -> int:
        """The cumulative energy counter, millijoules."""
        return self.gpu.energy_mj()

    def sample(self) -> tuple[int, int, tuple[str, ...]]:
        """``(sm_mhz, reason bits, reason names)``: what the GPU runs at now, and why."""
        reading = self.gpu.read_clock()
        if reading is None:
            raise GpuError(f"GPU {self.index} ({self.name}): its backend cannot read the clock")
        mhz, names = reading
        bits = reason_mask(names)
        return mhz, bits, reason_names(bits)

    def close(self) -> None:
        """Stop the worker (after its queued calls) and release the device (and any floor)."""
        self.worker.shutdown(wait=True)
        try:
            self.release_floor()
        except Exception as exc:  # noqa: BLE001 - closing; the backend's close disables it
            log.error("GPU %d: could not release its power floor: %s", self.index, exc)
        self.gpu.close()


def open_devices(
    vendor: GpuVendor,
    indices: Sequence[int] | None,
    *,
    read_only: bool,
    record: LockRecord | None = None,
) -> list[ManagedGpu]:
    """Open the GPUs ``indices`` (default: every GPU ``vendor`` counts) through ``vendor``.

    Raises :class:`~perseus_client.errors.GpuError` (driver missing, no such GPU) with the
    library's reason; GPUs opened before the failure are closed again.
    """
    opened: list[ManagedGpu] = []
    try:
        if indices is None:
            indices = range(vendor.count())
        for index in indices:
            gpu = vendor.open(index, read_only)
            try:
                opened.append(ManagedGpu(gpu, read_only=read_only, record=record))
            except BaseException:
                gpu.close()
                raise
    except BaseException:
        for managed in opened:
            managed.close()
        raise
    return opened


def open_gpus(
    nvml: Any,
    indices: Sequence[int] | None,
    *,
    read_only: bool,
    record: LockRecord | None = None,
) -> list[ManagedGpu]:
    """:func:`open_devices` through NVML on ``nvml``, or through the vendor the probe finds.

    ``nvml`` is a ``pynvml``-like module (the simulated one of ``--simulate``); with
    ``nvml=None``, the vendor is the one the availability probe finds
    (:func:`~perseus_client.gpu.vendors.choose_vendor`; NVML's when none is found).
    """
    from perseus_client.gpu.nvml import vendor
    from perseus_client.gpu.vendors import choose_vendor

    entry = choose_vendor() if nvml is None else vendor(nvml)
    return open_devices(entry, indices, read_only=read_only, record=record)
