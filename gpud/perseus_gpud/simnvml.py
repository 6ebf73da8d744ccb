"""An NVML stand-in: simulated A100 GPUs behind the ``pynvml`` functions the daemon calls.

``perseus gpud --simulate N`` serves :class:`SimulatedNvml` instead of the real ``pynvml``
module, so the daemon runs (and is tested) on machines without a GPU, and operators can try it.
It has the same names as ``pynvml`` for what Perseus uses (``nvmlInit``, ``nvmlShutdown``,
``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetName``,
``nvmlDeviceGetSupportedMemoryClocks``, ``nvmlDeviceGetSupportedGraphicsClocks``,
``nvmlDeviceSetGpuLockedClocks``, ``nvmlDeviceResetGpuLockedClocks``,
``nvmlDeviceGetTotalEnergyConsumption``, ``nvmlDeviceGetClockInfo``,
``nvmlDeviceGetCurrentClocksEventReasons``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetMinorNumber``,
``nvmlDeviceGetPowerUsage``, ``nvmlDeviceGetPowerManagementLimitConstraints``: an A100 SXM's
100-400 W), raises the real ``pynvml.NVMLError`` codes, and
enforces NVML's rules:

- every call but ``nvmlInit`` fails with ``UNINITIALIZED`` until ``nvmlInit`` (calls are counted,
  as NVML's are);
- a bad device index is ``INVALID_ARGUMENT``;
- locking or resetting clocks needs root (effective uid 0): ``NO_PERMISSION`` otherwise;
- a locked clock range must have min <= max within the supported range, else
  ``INVALID_ARGUMENT``.

Each GPU supports the SM clocks of the shipped A100 profile (:data:`A100_CLOCKS_MHZ`, those of
``profiles/gpt3-175b_a100-sxm_8stage.csv``) at one memory clock, keeps its locked-clock state and
an energy counter. Energy accrues with wall time at a power that grows with the clock in effect
(:data:`IDLE_W` plus up to :data:`DYNAMIC_W` at the maximum clock, cubically: a simple model, not
a measurement); only differences are meaningful, as on a real GPU.

With ``smoothing=True`` (``perseus gpud --simulate-smoothing``) the GPUs also have NVML's
power smoothing (nvidia-ml-py's ``nvmlDevicePowerSmoothing*`` functions and structs, as on
Blackwell GPUs; root only, like the clock calls): preset profile parameters (the floor as a
percentage of the power limit, the ramp-up and ramp-down rates in W/s), the active profile and
the feature's state, kept per GPU (:meth:`SimulatedNvml.smoothing`, and in ``state_path``).
While the feature is on, the power drawn and the energy counter are at least the active
profile's floor. Without it those functions are missing, as in an nvidia-ml-py or a GPU
without power smoothing.

Simulated GPU ``i`` has minor number ``i`` (its device node would be ``/dev/nvidia<i>``) and a
stable UUID (:func:`simulated_uuid`), the same in every process, as a real GPU's is.

``state_path`` keeps the lock state and the energy counter across processes (JSON, replaced
atomically on every change), so a daemon killed with a GPU locked finds it still locked when it
starts again, as with a real GPU. ``throttle_path`` (optional JSON, re-read when it changes)
injects throttling: ``{"0": {"cap_mhz": 1005, "reasons": ["hw_thermal_slowdown"]}}`` makes GPU 0
run at most 1005 MHz and report those clock-event reasons (names as in
:data:`~perseus_client.gpu.nvml.CLOCK_EVENT_REASONS`).
"""

from __future__ import annotations

import json
import os
import threading
import time
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from perseus_client.gpu.nvml import CLOCK_EVENT_REASONS

__all__ = [
    "SimulatedNvml",
    "SimulatedStateError",
    "simulated_uuid",
    "A100_CLOCKS_MHZ",
    "A100_MEMORY_MHZ",
    "IDLE_W",
    "DYNAMIC_W",
]

#: The SM clocks of the shipped A100 profile, highest first (15 MHz steps, 1410..855).
A100_CLOCKS_MHZ: tuple[int, ...] = tuple(range(1410, 854, -15))
#: The one memory clock the simulated GPUs report.
A100_MEMORY_MHZ = 1593
#: Model power at rest, watts.
IDLE_W = 60.0
#: Model power added at the maximum clock, watts.
DYNAMIC_W = 340.0
_NAME = "NVIDIA A100-SXM4-80GB (simulated)"
_BY_NAME = {name: bit for bit, name in CLOCK_EVENT_REASONS.items()}


def simulated_uuid(index: int) -> str:
    """The UUID of simulated GPU ``index`` (``GPU-`` and a name-based UUID; stable)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'perseus-simulated-gpu/{index}')}"


class SimulatedStateError(ValueError):
    """The simulated GPUs' state file cannot be used (not JSON, or not the expected shape)."""


@dataclass
class _Device:
    index: int
    locked: tuple[int, int] | None = None
    energy_j: float = 0.0
    since: float = 0.0  # monotonic time energy_j was last brought up to date
    sets: int = 0
    resets: int = 0
    # power smoothing: (profile, param) -> value, the active profile, the feature on
    params: dict[tuple[int, int], float] = field(default_factory=dict)
    active: int | None = None
    smoothing_on: bool = False


#: The simulated GPUs' power limit (W): the base of power smoothing's floor percentage.
POWER_LIMIT_W = 400.0


class _Handle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class SimulatedNvml:
    """``count`` simulated A100 GPUs with ``pynvml``'s interface (see the module docstring)."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM

    def __init__(
        self,
        count: int,
        *,
        state_path: str | os.PathLike[str] | None = None,
        throttle_path: str | os.PathLike[str] | None = None,
        clocks: tuple[int, ...] = A100_CLOCKS_MHZ,
        smoothing: bool = False,
    ) -> None:
        if count < 1:
            raise ValueError(f"count: must be >= 1 simulated GPU, got {count}")
        self.clocks = tuple(sorted(clocks, reverse=True))
        self._lock = threading.RLock()
        self._inits = 0
        now = time.monotonic()
        self._devices = [_Device(i, since=now) for i in range(count)]
        self._state_path = Path(state_path) if state_path is not None else None
        self._throttle_path = Path(throttle_path) if throttle_path is not None else None
        self._throttle: dict[int, tuple[int, int]] = {}
        self._throttle_mtime: int | None = None
        if smoothing:
            for name in _SMOOTHING_NAMES:
                fn = getattr(_Smoothing, name)
                setattr(self, name, types.MethodType(fn, self) if callable(fn) and
                        not isinstance(fn, type) else fn)  # fmt: skip
            for name in _SMOOTHING_CONSTANTS:
                setattr(self, name, getattr(pynvml, name))
        if self._state_path is not None and self._state_path.exists():
            self._load()

    # -- state ------------------------------------------------------------------------------------

    def _load(self) -> None:
        path = self._state_path
        assert path is not None
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise SimulatedStateError(
                f"the simulated GPUs' state file {path} cannot be read as JSON ({exc}); "
                "fix or remove it"
            ) from exc
        try:
            entries = doc.get("gpus", []) if isinstance(doc, dict) else None
            if not isinstance(entries, list):
                raise TypeError('expected an object {"gpus": [...]}')
            for entry in entries:
                i = int(entry["index"])
                if 0 <= i < len(self._devices):
                    dev = self._devices[i]
                    locked = entry.get("locked_mhz")
                    dev.locked = None if locked is None else (int(locked), int(locked))
                    dev.energy_j = float(entry.get("energy_mj", 0)) / 1000.0
                    dev.sets = int(entry.get("sets", 0))
                    dev.resets = int(entry.get("resets", 0))
                    sm = entry.get("smoothing") or {}
                    dev.smoothing_on = bool(sm.get("enabled", False))
                    dev.active = sm.get("active")
                    dev.params = {
                        (int(k.split(":")[0]), int(k.split(":")[1])): float(v)
                        for k, v in sm.get("params", {}).items()
                    }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SimulatedStateError(
                f"the simulated GPUs' state file {path} is malformed ({type(exc).__name__}: "
                f"{exc}); fix or remove it"
            ) from exc

    def _persist(self) -> None:
        if self._state_path is None:
            return
        self._accrue_all()
        doc = {
            "gpus": [
                {
                    "index": d.index,
                    "locked_mhz": None if d.locked is None else d.locked[1],
                    "energy_mj": int(d.energy_j * 1000.0),
                    "sets": d.sets,
                    "resets": d.resets,
                    "smoothing": {
                        "enabled": d.smoothing_on,
                        "active": d.active,
                        "params": {f"{p}:{k}": v for (p, k), v in sorted(d.params.items())},
                        "floor_w": _floor_w(d),
                    },
                }
                for d in self._devices
            ]
        }
        tmp = self._state_path.with_name(self._state_path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self._state_path)

    @staticmethod
    def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
        """The JSON a ``state_path`` stand-in keeps.

        ``{"gpus": [{"index", "locked_mhz", "energy_mj", "sets", "resets"}, ...]}``.
        """
        return dict(json.loads(Path(path).read_text()))

    def _read_throttle(self) -> None:
        path = self._throttle_path
        if path is None:
            return
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            self._throttle, self._throttle_mtime = {}, None
            return
        if mtime == self._throttle_mtime:
            return
        self._throttle_mtime = mtime
        try:
            doc = json.loads(path.read_text() or "{}")
        except ValueError:
            return  # being rewritten; keep the last setting
        throttle = {}
        for key, spec in doc.items():
            mask = 0
            for name in spec.get("reasons", []):
                mask |= _BY_NAME.get(str(name), 0)
            throttle[int(key)] = (int(spec.get("cap_mhz", self.clocks[0])), mask)
        self._throttle = throttle

    # -- helpers ----------------------------------------------------------------------------------

    def _error(self, code: int) -> Exception:
        return pynvml.NVMLError(code)

    def _device(self, handle: Any) -> _Device:
        if self._inits <= 0:
            raise self._error(pynvml.NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self._devices):
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._devices[handle.index]

    def _privileged(self) -> None:
        if os.geteuid() != 0:
            raise self._error(pynvml.NVML_ERROR_NO_PERMISSION)

    def _clock_of(self, dev: _Device) -> int:
        clock = self.clocks[0] if dev.locked is None else dev.locked[1]
        cap = self._throttle.get(dev.index)
        return clock if cap is None else min(clock, cap[0])

    def _power(self, dev: _Device) -> float:
        ratio = self._clock_of(dev) / self.clocks[0]
        return max(IDLE_W + DYNAMIC_W * ratio**3, _floor_w(dev))

    def _accrue(self, dev: _Device) -> None:
        now = time.monotonic()
        dev.energy_j += self._power(dev) * (now - dev.since)
        dev.since = now

    def _accrue_all(self) -> None:
        for dev in self._devices:
            self._accrue(dev)

    # -- pynvml ------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Initialise the simulated NVML (counted, as NVML counts its inits)."""
        with self._lock:
            self._inits += 1

    def nvmlShutdown(self) -> None:
        """Undo one :meth:`nvmlInit`; raises NVML's ``UNINITIALIZED`` when there is none."""
        with self._lock:
            if self._inits <= 0:
                raise self._error(pynvml.NVML_ERROR_UNINITIALIZED)
            self._inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        """The number of simulated GPUs; raises ``UNINITIALIZED`` before :meth:`nvmlInit`."""
        if self._inits <= 0:
            raise self._error(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        """The handle of GPU ``index``; raises NVML's error for an unknown index."""
        handle = _Handle(int(index))
        self._device(handle)
        return handle

    def nvmlDeviceGetName(self, handle: Any) -> str:
        """The simulated GPU's product name."""
        self._device(handle)
        return _NAME

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> tuple[int, int]:
        """``(min, max)`` power limits in milliwatts (an A100 SXM's)."""
        self._device(handle)
        return (100_000, 400_000)

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        """The one memory clock (MHz) the simulated GPU supports."""
        self._device(handle)
        return [A100_MEMORY_MHZ]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memory_mhz: int) -> list[int]:
        """The supported SM clocks (MHz) at ``memory_mhz``.

        Raises NVML's ``INVALID_ARGUMENT`` for another memory clock.
        """
        self._device(handle)
        if int(memory_mhz) != A100_MEMORY_MHZ:
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return list(self.clocks)

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM clock between ``min_mhz`` and ``max_mhz``; needs root, as NVML does."""
        with self._lock:
            dev = self._device(handle)
            self._privileged()
            lo, hi = int(min_mhz), int(max_mhz)
            if lo > hi or lo < self.clocks[-1] or hi > self.clocks[0]:
                raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._accrue(dev)
            dev.locked = (lo, hi)
            dev.sets += 1
            self._persist()

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        """Remove the SM clock lock; needs root, as NVML does."""
        with self._lock:
            dev = self._device(handle)
            self._privileged()
            self._accrue(dev)
            dev.locked = None
            dev.resets += 1
            self._persist()

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """The simulated GPU's total energy counter (mJ)."""
        with self._lock:
            dev = self._device(handle)
            self._read_throttle()
            self._accrue(dev)
            return int(dev.energy_j * 1000.0)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        """The simulated SM clock (MHz); only ``NVML_CLOCK_SM`` is supported."""
        with self._lock:
            dev = self._device(handle)
            if clock_type != pynvml.NVML_CLOCK_SM:
                raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self._read_throttle()
            return self._clock_of(dev)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        """The bit mask of the simulated GPU's current clock-event reasons."""
        with self._lock:
            dev = self._device(handle)
            self._read_throttle()
            cap = self._throttle.get(dev.index)
            return 0 if cap is None else cap[1]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        """The simulated GPU's UUID."""
        return simulated_uuid(self._device(handle).index)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        """The simulated GPU's device minor number: its index."""
        return self._device(handle).index

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """The model power at the clock in effect now, milliwatts (as NVML's)."""
        with self._lock:
            dev = self._device(handle)
            self._read_throttle()
            return int(self._power(dev) * 1000.0)

    # -- inspection -------------------------------------------------------------------------------

    def locked_clock(self, index: int) -> int | None:
        """The SM clock GPU ``index`` is locked at (``None``: not locked); for tests and tools."""
        locked = self._devices[index].locked
        return None if locked is None else locked[1]

    def smoothing(self, index: int) -> dict[str, Any]:
        """GPU ``index``'s power smoothing: ``enabled``, ``active``, ``params``, ``floor_w``."""
        with self._lock:
            dev = self._devices[index]
            return {
                "enabled": dev.smoothing_on,
                "active": dev.active,
                "params": dict(dev.params),
                "floor_w": _floor_w(dev),
            }


def _floor_w(dev: _Device) -> float:
    """The floor (W) the device holds now: the active profile's, while the feature is on."""
    if not dev.smoothing_on or dev.active is None:
        return 0.0
    percent = dev.params.get(
        (dev.active, pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR)
    )
    return 0.0 if percent is None else POWER_LIMIT_W * percent / 100.0


class _Smoothing:
    """nvidia-ml-py's power-smoothing calls, bound onto a :class:`SimulatedNvml` that has them."""

    c_nvmlPowerSmoothingProfile_v1_t = pynvml.c_nvmlPowerSmoothingProfile_v1_t
    c_nvmlPowerSmoothingState_v1_t = pynvml.c_nvmlPowerSmoothingState_v1_t

    def nvmlDevicePowerSmoothingUpdatePresetProfileParam(
        self: Any, handle: Any, profile: Any
    ) -> None:
        """Set one parameter of a preset profile (root only; checks the struct's version)."""
        with self._lock:
            dev = self._device(handle)
            self._privileged()
            if profile.version != pynvml.nvmlPowerSmoothingProfile_v1:
                raise self._error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            if not (0 <= profile.profileId < 5 and 0 <= profile.paramId <= 3):
                raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._accrue(dev)
            dev.params[(int(profile.profileId), int(profile.paramId))] = float(profile.value)
            self._persist()

    def nvmlDevicePowerSmoothingActivatePresetProfile(self: Any, handle: Any, profile: Any) -> None:
        """Make a preset profile the active one (root only)."""
        with self._lock:
            dev = self._device(handle)
            self._privileged()
            if not 0 <= profile.profileId < 5:
                raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._accrue(dev)
            dev.active = int(profile.profileId)
            self._persist()

    def nvmlDevicePowerSmoothingSetState(self: Any, handle: Any, state: Any) -> None:
        """Enable or disable power smoothing (root only; checks the struct's version)."""
        with self._lock:
            dev = self._device(handle)
            self._privileged()
            if state.version != pynvml.nvmlPowerSmoothingState_v1:
                raise self._error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            self._accrue(dev)
            dev.smoothing_on = state.state == pynvml.NVML_FEATURE_ENABLED
            self._persist()


_SMOOTHING_NAMES = (
    "c_nvmlPowerSmoothingProfile_v1_t",
    "c_nvmlPowerSmoothingState_v1_t",
    "nvmlDevicePowerSmoothingUpdatePresetProfileParam",
    "nvmlDevicePowerSmoothingActivatePresetProfile",
    "nvmlDevicePowerSmoothingSetState",
)
_SMOOTHING_CONSTANTS = (
    "NVML_FEATURE_ENABLED",
    "NVML_FEATURE_DISABLED",
    "NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR",
    "NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE",
    "NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE",
)
