"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` distribution, import name ``pynvml``).

Supported clocks come from ``nvmlDeviceGetSupportedMemoryClocks`` (the highest memory clock is
used) and ``nvmlDeviceGetSupportedGraphicsClocks``; clocks are locked with
``nvmlDeviceSetGpuLockedClocks(h, f, f)`` and released with ``nvmlDeviceResetGpuLockedClocks``;
energy is ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver was loaded). Two read-only
helpers tell what the GPU runs at: :meth:`NvmlGpu.current_sm_clock` (``nvmlDeviceGetClockInfo``)
and :meth:`NvmlGpu.clock_event_reasons` (``nvmlDeviceGetCurrentClocksEventReasons``, the
throttle reasons; names in :data:`perseus_common.clocks.CLOCK_EVENT_REASONS`, the table the
server shares). :meth:`NvmlGpu.sample_applied_clock`
combines them for the client's applied-clock sampler (see :mod:`perseus_client.gpu.applied`);
it answers ``None`` in ``dry_run`` (no clock was locked, so there is nothing to verify).

NVML failures become actionable :class:`~perseus_client.errors.GpuError` subclasses: locking
clocks needs root or CAP_SYS_ADMIN (:class:`GpuPermissionError`), Volta or newer
(:class:`GpuNotSupportedError`), and a loaded NVIDIA driver (:class:`GpuDriverError`).

``dry_run=True`` reads everything from the GPU but never changes a clock: lock and reset requests
are only recorded in :attr:`NvmlGpu.requests` (``("set", mhz)`` / ``("reset", None)``).

:data:`VENDOR` is NVML's entry in the backend registry (:mod:`perseus_client.gpu.vendors`): its
probe says yes where ``pynvml`` is importable and ``/dev/nvidiactl`` exists; :func:`vendor`
binds the entry to another ``pynvml``-like module (the node daemon's ``--simulate``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any

from perseus_client.errors import (
    GpuDriverError,
    GpuError,
    GpuNotSupportedError,
    GpuPermissionError,
    UnsupportedClockError,
)
from perseus_client.gpu.base import DeviceIdentity, GpuBackend, GpuVendor, hold_briefly
from perseus_client.gpu.floors import NvmlPowerSmoothing
from perseus_common.clocks import CLOCK_EVENT_REASONS, reason_names

log = logging.getLogger("perseus.client")

__all__ = ["NvmlGpu", "CLOCK_EVENT_REASONS", "VENDOR", "reason_names", "vendor"]


_PERMISSION_HINT = (
    "locking GPU clocks needs root or the CAP_SYS_ADMIN capability: run the training process as "
    "root, grant it CAP_SYS_ADMIN (e.g. docker run --cap-add SYS_ADMIN), or use NvmlGpu(dry_run=True) "
    "to record the requested clocks without applying them"
)
_NOT_SUPPORTED_HINT = (
    "this GPU or driver does not support locking SM clocks (it needs a Volta or newer GPU and a "
    "recent driver); use NvmlGpu(dry_run=True) or SimulatedGpu instead"
)
_DRIVER_HINT = (
    "no NVIDIA driver could be reached through NVML (is the driver installed and loaded, is "
    "libnvidia-ml.so on the library path, and is the GPU visible in this container?)"
)


class NvmlGpu(GpuBackend):
    """One NVIDIA GPU controlled through NVML.

    Args:
        index: NVML device index (NVML does not follow ``CUDA_VISIBLE_DEVICES``).
        dry_run: record clock requests in :attr:`requests` instead of applying them.
        nvml: the ``pynvml`` module to use (tests pass a fake); imported lazily by default.
    """

    def __init__(
        self, index: int = 0, *, dry_run: bool = False, nvml: ModuleType | Any = None
    ) -> None:
        if index < 0:
            raise ValueError(f"index: must be >= 0, got {index}")
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:  # pragma: no cover - dependency is declared
                raise GpuDriverError(
                    "the nvidia-ml-py package (import name pynvml) is not installed"
                ) from exc
        self._nvml = nvml
        self.index = index
        self.dry_run = dry_run
        #: Every lock/reset request, in order: ``("set", mhz)`` or ``("reset", None)``.
        self.requests: list[tuple[str, int | None]] = []
        self._lock = threading.RLock()
        self._identity: DeviceIdentity | None = None
        self._call("initialise NVML", nvml.nvmlInit)
        self._initialised = True
        try:
            self._handle = self._call(f"open GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
            raw_name = self._call("read the GPU name", nvml.nvmlDeviceGetName, self._handle)
            self.name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            self._clocks = self._read_supported_clocks()
        except BaseException:
            self.close()
            raise

    # -- reading ------------------------------------------------------------------------------

    def _read_supported_clocks(self) -> tuple[int, ...]:
        nvml = self._nvml
        memory = self._call(
            "list supported memory clocks", nvml.nvmlDeviceGetSupportedMemoryClocks, self._handle
        )
        if not memory:
            raise GpuNotSupportedError(
                f"GPU {self.index} reports no supported memory clocks; {_NOT_SUPPORTED_HINT}"
            )
        graphics = self._call(
            "list supported graphics clocks",
            nvml.nvmlDeviceGetSupportedGraphicsClocks,
            self._handle,
            max(int(m) for m in memory),
        )
        clocks = tuple(sorted({int(g) for g in graphics}, reverse=True))
        if not clocks:
            raise GpuNotSupportedError(
                f"GPU {self.index} reports no supported SM clocks; {_NOT_SUPPORTED_HINT}"
            )
        return clocks

    def identity(self) -> DeviceIdentity:
        """Index, UUID and device node of the GPU, read once.

        The UUID from ``nvmlDeviceGetUUID``, the device node ``/dev/nvidia<minor>`` from
        ``nvmlDeviceGetMinorNumber``.
        """
        if self._identity is None:
            nvml = self._nvml
            raw = self._call("read the GPU UUID", nvml.nvmlDeviceGetUUID, self._handle)
            minor = int(
                self._call("read the minor number", nvml.nvmlDeviceGetMinorNumber, self._handle)
            )
            uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
            self._identity = DeviceIdentity(self.index, uuid, f"/dev/nvidia{minor}")
        return self._identity

    def supported_clocks(self) -> tuple[int, ...]:
        """Supported SM clocks (MHz), highest first, read from NVML once."""
        return self._clocks

    def max_power_limit_w(self) -> float | None:
        """The largest power limit NVML allows on this GPU (W; read once, read-only).

        ``None`` where NVML cannot tell (an older driver, a GPU without power management).
        """
        if not hasattr(self, "_max_power"):
            self._max_power: float | None = None
            fn = getattr(self._nvml, "nvmlDeviceGetPowerManagementLimitConstraints", None)
            if fn is not None:
                try:
                    _, hi = fn(self._handle)  # milliwatts
                except self._nvml.NVMLError:
                    pass
                else:
                    self._max_power = float(hi) / 1000.0 if hi and hi > 0 else None
        return self._max_power

    def energy_mj(self) -> int:
        """NVML's total energy counter (mJ)."""
        return int(
            self._call(
                "read the energy counter",
                self._nvml.nvmlDeviceGetTotalEnergyConsumption,
                self._handle,
            )
        )

    def current_sm_clock(self) -> int:
        """The SM clock the GPU runs at now, in MHz (read-only)."""
        nvml = self._nvml
        return int(
            self._call(
                "read the SM clock", nvml.nvmlDeviceGetClockInfo, self._handle, nvml.NVML_CLOCK_SM
            )
        )

    def clock_event_reasons(self) -> int:
        """NVML's current clock-event (throttle) reason bits (read-only; see :func:`reason_names`)."""
        nvml = self._nvml
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is None:  # older nvidia-ml-py
            fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._call("read the clock-event reasons", fn, self._handle))

    def read_clock(self) -> tuple[int, frozenset[str]]:
        """The SM clock now (MHz) and the names of NVML's clock-event reasons."""
        return self.current_sm_clock(), frozenset(reason_names(self.clock_event_reasons()))

    def power_w(self) -> float:
        """The power draw now (``nvmlDeviceGetPowerUsage``), watts."""
        nvml = self._nvml
        return float(self._call("read the power", nvml.nvmlDeviceGetPowerUsage, self._handle)) / 1e3

    def sample_applied_clock(self) -> tuple[int, frozenset[str]] | None:
        """:meth:`read_clock`; ``None`` in dry-run mode, where no lock was applied."""
        if self.dry_run:
            return None  # no lock was applied: nothing to verify
        return self.read_clock()

    # -- control ------------------------------------------------------------------------------

    def set_locked_clocks(self, mhz: int) -> None:
        """Lock the SM clock at ``mhz`` through NVML; raises when ``mhz`` is not supported."""
        mhz = int(mhz)
        if mhz not in self._clocks:
            raise UnsupportedClockError(
                f"frequency_mhz: {mhz} MHz is not a supported SM clock of GPU {self.index} "
                f"({self.name}); supported: {self._clocks[0]}..{self._clocks[-1]} MHz"
            )
        with self._lock:
            self.requests.append(("set", mhz))
            if self.dry_run:
                return
            self._call(
                f"lock the SM clock at {mhz} MHz",
                self._nvml.nvmlDeviceSetGpuLockedClocks,
                self._handle,
                mhz,
                mhz,
            )

    def reset_locked_clocks(self) -> None:
        """Remove the SM clock lock through NVML, waiting only briefly for this backend's lock."""
        # NVML is thread-safe; the lock only orders this backend's calls, so a reset waits for it
        # only briefly (a set stuck in the driver must not keep the GPU locked; see base).
        with hold_briefly(self._lock):
            self.requests.append(("reset", None))
            if self.dry_run:
                return
            self._call(
                "reset the locked SM clocks",
                self._nvml.nvmlDeviceResetGpuLockedClocks,
                self._handle,
            )

    def synchronize(self) -> None:
        """Wait for torch's queued CUDA work, when torch has CUDA initialised."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def floor_unavailable(self) -> str | None:
        """Why this GPU cannot hold a floor through NVML power smoothing; None when it can."""
        if self.dry_run:
            return "dry run: no power floor is applied"
        if self.max_power_limit_w() is None:
            return "NVML does not report this GPU's power limit (the floor's percentage base)"
        return NvmlPowerSmoothing.available(self._nvml)

    def set_power_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> bool:
        """Hold ``watts`` through NVML power smoothing (False: this GPU cannot; said once).

        ``ramp_w_per_s`` (> 0): the smoothing profile's ramp-up and ramp-down rates.
        """
        if not hasattr(self, "_smoothing"):
            why = self.floor_unavailable()
            limit = self.max_power_limit_w()
            self._smoothing = (
                None if why is not None or limit is None
                else NvmlPowerSmoothing(self._nvml, self._handle, limit)
            )  # fmt: skip
        if self._smoothing is None:
            return False
        try:
            self._smoothing.set_floor(watts, ramp_w_per_s)
        except self._nvml.NVMLError as e:
            log.warning("perseus: NVML power smoothing refused a floor (%s); floors off", e)
            self._smoothing = None
            return False
        return True

    def release_power_floor(self) -> bool:
        """Floor 0 and power smoothing disabled, whoever set them (False: no power smoothing)."""
        limit = self.max_power_limit_w()
        if self.dry_run or limit is None or NvmlPowerSmoothing.available(self._nvml) is not None:
            return False
        NvmlPowerSmoothing(self._nvml, self._handle, limit).release()
        return True

    def close(self) -> None:
        """Release the floor, then shut NVML down, once; clocks are left as they are."""
        smoothing = getattr(self, "_smoothing", None)
        if smoothing is not None:
            with contextlib.suppress(Exception):  # closing; the floor ends with the process
                smoothing.close()
        if getattr(self, "_initialised", False):
            self._initialised = False
            with contextlib.suppress(Exception):  # shutting down; nothing useful to do
                self._nvml.nvmlShutdown()

    # -- errors -------------------------------------------------------------------------------

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        nvml = self._nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            raise self._translate(what, exc) from exc

    def _translate(self, what: str, exc: Any) -> GpuError:
        nvml = self._nvml
        code = getattr(exc, "value", None)
        prefix = f"could not {what} on GPU {self.index}: {exc}"
        if code == nvml.NVML_ERROR_NO_PERMISSION:
            return GpuPermissionError(f"{prefix}; {_PERMISSION_HINT}")
        if code == nvml.NVML_ERROR_NOT_SUPPORTED:
            return GpuNotSupportedError(f"{prefix}; {_NOT_SUPPORTED_HINT}")
        if code in (
            nvml.NVML_ERROR_DRIVER_NOT_LOADED,
            nvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        ):
            return GpuDriverError(f"{prefix}; {_DRIVER_HINT}")
        if code in (
            nvml.NVML_ERROR_INVALID_ARGUMENT,
            nvml.NVML_ERROR_NOT_FOUND,
        ) and what.startswith("open GPU"):
            return GpuDriverError(f"{prefix}; no GPU with NVML index {self.index}")
        return GpuError(prefix)


def _importable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def vendor(library: ModuleType | Any = None) -> GpuVendor:
    """NVML's registry entry, on ``library`` (a ``pynvml``-like module; default: ``pynvml``)."""

    def available() -> bool:
        if library is not None:
            return True
        return _importable("pynvml") and os.path.exists("/dev/nvidiactl")

    def open_gpu(index: int, dry_run: bool) -> GpuBackend:
        return NvmlGpu(index, dry_run=dry_run, nvml=library)

    def count() -> int:
        probe = NvmlGpu(0, dry_run=True, nvml=library)
        try:
            return int(probe._call("count the GPUs", probe._nvml.nvmlDeviceGetCount))
        finally:
            probe.close()

    return GpuVendor("nvml", available, open_gpu, count)


#: NVML's entry in :data:`perseus_client.gpu.vendors.VENDORS`.
VENDOR = vendor()
