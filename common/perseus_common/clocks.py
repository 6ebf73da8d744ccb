"""GPU clock vocabulary the rank client and the server share.

The SM clock bound and NVML's clock-event reason names.

* :data:`MAX_CLOCK_MHZ` — the largest SM clock accepted anywhere (rank registration, profiles,
  reports, online profiling's clocks); far above any GPU's and far below int32.
* :data:`CLOCK_EVENT_REASONS` — NVML's clock-event (throttle) reason bits
  (``nvmlDeviceGetCurrentClocksEventReasons``) and the names Perseus reports them by; the client
  sends the names, the server counts any other name as ``other``. :func:`reason_names` and
  :func:`reason_mask` convert between a mask and its names (a bit without a name is ``"0x..."``),
  so a backend of another vendor reports names and the node daemon still has its bits.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "MAX_CLOCK_MHZ",
    "CLOCK_EVENT_REASONS",
    "CLOCK_EVENT_REASON_NAMES",
    "reason_mask",
    "reason_names",
]

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


_BITS = {name: bit for bit, name in CLOCK_EVENT_REASONS.items()}


def reason_names(mask: int) -> tuple[str, ...]:
    """The names of the reason bits set in ``mask`` (unknown bits as ``"0x..."``), lowest first."""
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCK_EVENT_REASONS.get(bit, f"{bit:#x}"))
        bit <<= 1
    return tuple(names)


def reason_mask(names: Iterable[str]) -> int:
    """The bits of reason ``names``: the inverse of :func:`reason_names`.

    A name neither known nor ``"0x..."`` has no bit.
    """
    mask = 0
    for name in names:
        bit = _BITS.get(name)
        if bit is None and name.startswith("0x"):
            try:
                bit = int(name, 16)
            except ValueError:
                bit = None
        mask |= bit or 0
    return mask
