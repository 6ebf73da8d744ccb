"""Straggler detection from reported iteration times, with hysteresis.

A data-parallel pipeline is a straggler when its iteration time exceeds the time its deployed
plan should take by more than ``threshold`` (default 5 %) for ``consecutive`` iterations in a
row (default 3); its observed time T' is the mean of those iterations. It recovers when its time
is back within ``recovery`` (default 2 %) of the plan's time for ``consecutive`` iterations.
Only iterations run under the currently deployed plan version are counted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DetectorSettings", "StragglerDetector"]


@dataclass(frozen=True)
class DetectorSettings:
    threshold: float = 0.05
    consecutive: int = 3
    recovery: float = 0.02

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "consecutive": self.consecutive,
            "recovery": self.recovery,
        }


@dataclass
class StragglerDetector:
    """Per-pipeline counters; :meth:`observe` returns ``"slow"`` / ``"recovered"`` / ``None``."""

    settings: DetectorSettings = field(default_factory=DetectorSettings)
    _slow: dict[int, deque[float]] = field(default_factory=dict)
    _fast: dict[int, int] = field(default_factory=dict)

    def observe(
        self, pipeline: int, time: float, expected: float, flagged: bool
    ) -> tuple[str | None, float]:
        """Feed one iteration of ``pipeline``; ``flagged``: whether it is a straggler now.

        Returns the event (or None) and the current estimate of T' (0 when not slow).
        """
        s = self.settings
        slow = self._slow.setdefault(pipeline, deque(maxlen=s.consecutive))
        if time > expected * (1 + s.threshold):
            slow.append(time)
            self._fast[pipeline] = 0
        elif time <= expected * (1 + s.recovery):
            slow.clear()
            self._fast[pipeline] = self._fast.get(pipeline, 0) + 1
        else:  # in the hysteresis band: neither slow nor recovered
            slow.clear()
            self._fast[pipeline] = 0
        t_prime = sum(slow) / len(slow) if slow else 0.0
        if not flagged and len(slow) >= s.consecutive:
            return "slow", t_prime
        if flagged and self._fast.get(pipeline, 0) >= s.consecutive:
            self._fast[pipeline] = 0
            return "recovered", 0.0
        return None, t_prime

    def reset(self, pipeline: int | None = None) -> None:
        if pipeline is None:
            self._slow.clear()
            self._fast.clear()
        else:
            self._slow.pop(pipeline, None)
            self._fast.pop(pipeline, None)
