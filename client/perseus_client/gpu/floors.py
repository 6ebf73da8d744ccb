"""Power floors: a rank's floors from its plan, played against the iteration's clock.

Under a swing bound the server sends each rank ``power_floors``: ``(start_s, end_s, watts)``
within one iteration, t = 0 at its start (``docs/power.md``). The GPU must draw at least
``watts`` then. Two pieces apply them:

* :class:`FloorPlayer`, a daemon thread the client starts at every iteration boundary: it sets
  the GPU's floor (:meth:`GpuBackend.set_power_floor`) to each level in turn as the iteration's
  time (the GPU's :meth:`~GpuBackend.timestamp` since the boundary) reaches it, and to 0 after
  the last; an iteration that lasts longer than planned keeps 0 until the next boundary.
* :class:`NvmlPowerSmoothing`, how an NVML GPU holds a floor: NVML power smoothing
  (``nvmlDevicePowerSmoothing*``, nvidia-ml-py; Blackwell or newer, root): the floor as a
  percentage of the GPU's power limit (``PERCENT_TMP_FLOOR`` of a preset profile), the ramp-up and
  ramp-down rates in W/s, the feature enabled once and disabled on close.

A GPU that cannot hold a floor (no power smoothing, no permission, another vendor) says so:
:meth:`GpuBackend.set_power_floor` returns False, and the client's ``floor_status`` names the
reason and the swing the plan alone achieves (``Plan.plan_swing``); its reports carry it to the
server (``IterationReport.power_floor``: :func:`floor_state`), which shows it in the job's
status. Training is never blocked:
a failing floor is dropped, never retried on the training thread.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("perseus.client")

__all__ = ["FloorPlayer", "NvmlPowerSmoothing", "floor_changes", "floor_state", "floor_status"]

#: The preset profile whose parameters Perseus sets (NVML has 5; the operator's others stay).
SMOOTHING_PROFILE = 0


def floor_changes(floors: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """``(t, watts)``: the floor level from each ``t`` on, in time order (0 between floors).

    Overlapping floors hold the higher; floors that are not floors (NaN, empty, not > 0 W)
    are dropped.
    """
    valid = [
        (float(s), float(e), float(w))
        for s, e, w in floors
        if math.isfinite(s + e + w) and 0 <= s < e and w > 0
    ]
    out: list[tuple[float, float]] = []
    for t in sorted({x for s, e, _ in valid for x in (s, e)}):
        level = max((w for s, e, w in valid if s <= t < e), default=0.0)
        if (out[-1][1] if out else 0.0) != level:
            out.append((t, level))
    return out


class FloorPlayer:
    """Plays one rank's floors on its GPU, restarted at every iteration boundary."""

    def __init__(self, gpu: Any, poll_s: float = 0.001) -> None:
        self.gpu = gpu
        self.poll_s = poll_s
        self._changes: list[tuple[float, float]] = []
        self._ramp = 0.0
        self._start = 0.0
        self._epoch = 0
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        #: False once the GPU refused a floor (it cannot hold one); True while it holds them.
        self.holds: bool | None = None

    def start_iteration(
        self, floors: Sequence[tuple[float, float, float]], ramp_w_per_s: float = 0.0
    ) -> None:
        """An iteration starts now: play ``floors`` from t = 0 (none: the floor goes to 0).

        ``ramp_w_per_s``: the rate the GPU may move its floor at (0: its own).
        """
        changes = floor_changes(floors)
        with self._wake:
            if not changes and not self._changes:
                return
            self._ramp = ramp_w_per_s if math.isfinite(ramp_w_per_s) and ramp_w_per_s > 0 else 0.0
            self._changes, self._start, self._epoch = changes, self.gpu.timestamp(), self._epoch + 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="perseus-floors", daemon=True
                )
                self._thread.start()
            self._wake.notify_all()

    def close(self) -> None:
        """Stop playing and release the floor."""
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._set(0.0)

    def _set(self, watts: float) -> None:
        try:
            ok = bool(self.gpu.set_power_floor(watts, self._ramp))
        except Exception as e:  # never let a floor break training
            log.warning("perseus: the GPU refused a power floor of %.0f W: %s", watts, e)
            ok = False
        if watts > 0:
            self.holds = ok

    def _run(self) -> None:
        applied = 0.0
        while True:
            with self._wake:
                if self._stop:
                    return
                epoch, changes, start = self._epoch, list(self._changes), self._start
            for t, watts in changes:
                while True:
                    with self._wake:
                        if self._stop or self._epoch != epoch:
                            break
                        left = start + t - self.gpu.timestamp()
                        if left <= 0:
                            break
                        self._wake.wait(timeout=self.poll_s)
                if self._stop or self._epoch != epoch:
                    break
                if watts != applied and self.holds is not False:
                    self._set(watts)
                    applied = watts
            else:
                if applied != 0.0 and self.holds is not False:
                    self._set(0.0)
                    applied = 0.0
                with self._wake:
                    while not self._stop and self._epoch == epoch:
                        self._wake.wait()


class NvmlPowerSmoothing:
    """A floor through NVML power smoothing on one device (see the module docstring).

    Args:
        nvml: the ``pynvml`` module (or a fake with the same functions and structs).
        handle: the device handle.
        limit_w: the power limit (W) the floor's percentage is of.
        ramp_w_per_s: the ramp-up and ramp-down rates to set (W/s); None: leave them (until
            :meth:`set_floor` is given some).
    """

    def __init__(
        self, nvml: Any, handle: Any, limit_w: float, ramp_w_per_s: float | None = None
    ) -> None:
        self.nvml, self.handle, self.limit_w = nvml, handle, float(limit_w)
        self.ramp_w_per_s = ramp_w_per_s
        self._sent_ramp: float | None = None
        self.enabled = False

    @staticmethod
    def available(nvml: Any) -> str | None:
        """None when ``nvml`` has power smoothing; else why not."""
        needed = (
            "nvmlDevicePowerSmoothingSetState",
            "nvmlDevicePowerSmoothingUpdatePresetProfileParam",
            "nvmlDevicePowerSmoothingActivatePresetProfile",
            "c_nvmlPowerSmoothingProfile_v1_t",
            "c_nvmlPowerSmoothingState_v1_t",
        )
        missing = [n for n in needed if not hasattr(nvml, n)]
        if missing:
            return f"this nvidia-ml-py has no power smoothing ({missing[0]})"
        return None

    def _param(self, param: int, value: float) -> None:
        p = self.nvml.c_nvmlPowerSmoothingProfile_v1_t()
        p.profileId, p.paramId, p.value = SMOOTHING_PROFILE, param, float(value)
        self.nvml.nvmlDevicePowerSmoothingUpdatePresetProfileParam(self.handle, p)

    def _state(self, on: bool) -> None:
        s = self.nvml.c_nvmlPowerSmoothingState_v1_t()
        s.state = self.nvml.NVML_FEATURE_ENABLED if on else self.nvml.NVML_FEATURE_DISABLED
        self.nvml.nvmlDevicePowerSmoothingSetState(self.handle, s)

    def set_floor(self, watts: float, ramp_w_per_s: float = 0.0) -> None:
        """Hold at least ``watts`` (0: no floor); enables the feature on first use.

        ``ramp_w_per_s`` (> 0): the ramp-up and ramp-down rates from now on (sent when they
        change); 0 keeps those set before (or the profile's own).
        """
        nvml = self.nvml
        percent = max(0.0, min(100.0, 100.0 * watts / self.limit_w))
        if ramp_w_per_s > 0 and math.isfinite(ramp_w_per_s):
            self.ramp_w_per_s = float(ramp_w_per_s)
        if not self.enabled and watts <= 0:
            return
        self._ramps()
        if not self.enabled:
            self._param(nvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR, percent)
            p = nvml.c_nvmlPowerSmoothingProfile_v1_t()
            p.profileId = SMOOTHING_PROFILE
            nvml.nvmlDevicePowerSmoothingActivatePresetProfile(self.handle, p)
            self._state(True)
            self.enabled = True
            return
        self._param(nvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR, percent)

    def _ramps(self) -> None:
        """Send the ramp rates when they differ from those last sent."""
        nvml, rate = self.nvml, self.ramp_w_per_s
        if rate is None or rate == self._sent_ramp:
            return
        self._param(nvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE, rate)
        self._param(nvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE, rate)
        self._sent_ramp = rate

    def release(self) -> None:
        """Floor 0 and the feature disabled, whoever enabled it (recovery after a crash)."""
        self._param(self.nvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR, 0.0)
        self._state(False)
        self.enabled = False

    def close(self) -> None:
        """Floor 0 and the feature disabled (only if this object enabled it)."""
        if self.enabled:
            self._param(self.nvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR, 0.0)
            self._state(False)
            self.enabled = False


def floor_state(gpu: Any, plan: Any, player: FloorPlayer) -> tuple[str, str, float] | None:
    """What a rank reports of its floors (``IterationReport.power_floor``).

    ``("held", "", plan_swing)`` or ``("unavailable", why, plan_swing)``; None when its plan
    has no floors.
    """
    floors = getattr(plan, "power_floors", ()) if plan is not None else ()
    if not floors:
        return None
    swing = float(getattr(plan, "plan_swing", 0.0))
    why = gpu.floor_unavailable()
    if why is None and player.holds is not False:
        return ("held", "", swing)
    return ("unavailable", (why or "the GPU refused the floor")[:256], swing)


def floor_status(gpu: Any, plan: Any, player: FloorPlayer) -> str | None:
    """What a rank says of its floors: None without any; held; or why not and the plan's swing."""
    state = floor_state(gpu, plan, player)
    if state is None:
        return None
    if state[0] == "held":
        return f"holding {len(plan.power_floors)} power floor(s) per iteration"
    return f"this GPU cannot hold a power floor ({state[1]}): the plan alone swings {state[2]:.2f}"
