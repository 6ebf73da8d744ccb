"""The daemon's NVML access layer: the GPUs it manages and the only operations it performs.

:func:`open_gpus` opens the managed GPUs through :class:`~perseus_client.gpu.nvml.NvmlGpu` on a
``pynvml``-like module (the real ``pynvml``, or :class:`~perseus_client.gpud.simnvml.SimulatedNvml`
with ``--simulate``). :class:`ManagedGpu` exposes exactly what the protocol allows: lock the SM
clock at a supported value, reset it, read the supported clocks, the energy counter, the current
SM clock and the clock-event reasons; for the daemon itself (ownership, metrics) the UUID, minor
number and power draw. No other NVML call is reachable from a client.

With a :class:`~perseus_client.gpud.lockrecord.LockRecord`, a lock is recorded before NVML
applies it and forgotten after NVML reset it (the record says what to reset after a crash).

Each GPU has a single worker thread: NVML calls block (a lock takes milliseconds, and a sick
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

from perseus_client.errors import UnsupportedClockError
from perseus_client.gpu.nvml import NvmlGpu, reason_names
from perseus_client.gpud.lockrecord import LockRecord

__all__ = ["ManagedGpu", "open_gpus"]

log = logging.getLogger("perseus_client.gpud")


class ManagedGpu:
    """One GPU the daemon manages (see the module docstring); methods block (run them in
    :attr:`worker`)."""

    def __init__(self, gpu: NvmlGpu, *, read_only: bool, record: LockRecord | None = None) -> None:
        self.gpu = gpu
        self.index = gpu.index
        self.name = gpu.name
        self.clocks = gpu.supported_clocks()
        #: NVML's maximum power limit (W; 0: unknown), sent with the GPU's info.
        self.max_power_limit_w = gpu.max_power_limit_w() or 0.0
        self.read_only = read_only
        self.record = record
        nvml = gpu._nvml
        raw = gpu._call("read the GPU UUID", nvml.nvmlDeviceGetUUID, gpu._handle)
        #: The GPU's UUID (``GPU-...``), the name leases use.
        self.uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
        #: The minor number of its device node ``/dev/nvidia<minor>``.
        self.minor = int(
            gpu._call("read the minor number", nvml.nvmlDeviceGetMinorNumber, gpu._handle)
        )
        #: The SM clock this daemon locked (``None``: not locked, or read-only).
        self.locked_mhz: int | None = None
        #: In read-only mode, what the daemon would have done: ``("set", mhz)`` / ``("reset", None)``.
        self.would: list[tuple[str, int | None]] = []
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
        within a lease keeps it, so the next lock writes nothing)."""
        self.gpu.reset_locked_clocks()
        if self.read_only:
            self.would.append(("reset", None))
            return False
        self.locked_mhz = None
        if self.record is not None and forget:
            self.record.forget(self.uuid)
        return True

    def power_w(self) -> float:
        """The power draw now, watts."""
        nvml = self.gpu._nvml
        return (
            float(self.gpu._call("read the power", nvml.nvmlDeviceGetPowerUsage, self.gpu._handle))
            / 1000.0
        )

    def energy_mj(self) -> int:
        """The cumulative energy counter, millijoules."""
        return self.gpu.energy_mj()

    def sample(self) -> tuple[int, int, tuple[str, ...]]:
        """``(sm_mhz, reason bits, reason names)``: what the GPU runs at now, and why."""
        mhz = self.gpu.current_sm_clock()
        reasons = self.gpu.clock_event_reasons()
        return mhz, reasons, reason_names(reasons)

    def close(self) -> None:
        """Stop the worker (after its queued calls) and release NVML."""
        self.worker.shutdown(wait=True)
        self.gpu.close()


def open_gpus(
    nvml: Any,
    indices: Sequence[int] | None,
    *,
    read_only: bool,
    record: LockRecord | None = None,
) -> list[ManagedGpu]:
    """Open the GPUs ``indices`` (default: every GPU NVML sees) through ``nvml``.

    Raises :class:`~perseus_client.errors.GpuError` (driver missing, no such GPU) with NVML's
    reason; GPUs opened before the failure are closed again.
    """
    opened: list[ManagedGpu] = []
    try:
        if indices is None:
            probe = NvmlGpu(0, dry_run=True, nvml=nvml)
            try:
                indices = range(int(nvml.nvmlDeviceGetCount()))
            finally:
                probe.close()
        for index in indices:
            opened.append(
                ManagedGpu(
                    NvmlGpu(index, dry_run=read_only, nvml=nvml),
                    read_only=read_only,
                    record=record,
                )
            )
    except BaseException:
        for gpu in opened:
            gpu.close()
        raise
    return opened
