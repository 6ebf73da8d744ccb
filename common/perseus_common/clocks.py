"""GPU clock vocabulary the rank client and the server share: the SM clock bound and NVML's
clock-event reason names.

* :data:`MAX_CLOCK_MHZ` — the largest SM clock accepted anywhere (rank registration, profiles,
  reports, online profiling's clocks); far above any GPU's and far below int32.
* :data:`CLOCK_EVENT_REASONS` — NVML's clock-event (throttle) reason bits
  (``nvmlDeviceGetCurrentClocksEventReasons``) and the names Perseus reports them by; the client
  sends the names, the server counts any other name as ``other``.
"""

from __future__ import annotations

__all__ = ["MAX_CLOCK_MHZ", "CLOCK_EVENT_REASONS", "CLOCK_EVENT_REASON_NAMES"]

#: Largest SM clock in MHz accepted anywhere.
MAX_CLOCK_MHZ = 100_000

#: NVML's clock-event (throttle) reason bits and the names Perseus reports them by.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

#: The names of :data:`CLOCK_EVENT_REASONS`.
CLOCK_EVENT_REASON_NAMES: frozenset[str] = frozenset(CLOCK_EVENT_REASONS.values())
