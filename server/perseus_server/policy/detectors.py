"""Straggler detection from reported iteration times, with hysteresis; slow-stage detection from
reported per-instruction times.

**Pipelines.** Each reported iteration of a data-parallel pipeline gives a ratio ``observed /
planned`` (the planned time of the plan version the iteration ran). A real run never matches the
profile exactly (communication, launch overheads), and that overhead is common to every pipeline,
so ratios are compared against the job's *calibration* ``c``: the smallest, over the pipelines, of
the median of their last few ratios (the healthiest pipeline's overhead; 1 before any report). A
pipeline is a straggler when its ratio exceeds ``c * (1 + threshold)`` (default 5 %) for
``consecutive`` iterations in a row (default 3); its observed time T' is the median of those
iterations (``T' / c`` on the profile's time axis): the first of them often straddles the moment
the pipeline slowed down, and the median does not let it drag T' below the new pace. While it is a
straggler, ``consecutive`` slow iterations in a row that all differ from the current T' by more
than the threshold mean its pace changed: their median is the new T' (as for slow stages). It
recovers when ``consecutive`` iterations in a row are below the straggler threshold and their mean
ratio is within ``c * (1 + recovery)`` (default 2 %). Only iterations run under the currently
deployed plan version are counted. If every pipeline slows down alike, none is a straggler: nobody
waits for anybody.

**Off-plan clocks.** A rank whose GPU ran instructions more than one supported clock step below
their locked clock in any of its last :data:`OFF_PLAN_WINDOW` reported iterations (throttling; see
:mod:`perseus_server.service.clock_verification`) runs *off-plan*, and its measured times are
what they are: while a pipeline has an off-plan rank, the lowest-ranked one of them (not the
pipeline's leader) feeds the iteration detector, so its slower iterations make the pipeline a
straggler by the rule above (they are never discarded as noise, nor diluted by a leader that
does not wait for it), and the status names ``off-plan clocks`` as the straggler's cause. Once
no rank of the pipeline ran off-plan for a window, the leader feeds the detector again and the
pipeline recovers by the rule above.

**Stages.** Per-instruction times reported by a rank, divided by the profile's time for that
instruction at the clock it ran at, give each stage's slowdown factor for one iteration (the
median over its instructions). A stage whose factor exceeds ``1 + threshold`` for
``consecutive`` iterations is slow with the mean factor of those iterations; it recovers once its
factor is within ``1 + recovery`` for ``consecutive`` iterations.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from perseus_server.domain.states import DetectorEvent

__all__ = [
    "DetectorSettings",
    "OFF_PLAN_WINDOW",
    "RankClocks",
    "StragglerDetector",
    "StageDetector",
]

#: Iterations per pipeline kept for the calibration median.
CALIBRATION_WINDOW = 5
#: A rank's latest reported iterations in which an off-plan instruction makes it off-plan.
OFF_PLAN_WINDOW = 16


@dataclass
class RankClocks:
    """A rank's applied-clock record: per iteration of the window ``(iteration, off-plan
    instructions, reasons seen in them, samples)``, the all-time count, and the latest off-plan
    instruction (a JSON-ready dict with its iteration)."""

    recent: deque[tuple[int, int, frozenset[str], int]] = field(
        default_factory=lambda: deque(maxlen=OFF_PLAN_WINDOW)
    )
    total: int = 0
    last: dict[str, Any] | None = None

    @property
    def off_plan(self) -> bool:
        """Whether an iteration of the window had an off-plan instruction."""
        return any(count for _, count, _, _ in self.recent)


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
    """Per-pipeline counters; :meth:`observe` returns a :class:`DetectorEvent` (``slow`` /
    ``changed`` / ``recovered``) or ``None``."""

    settings: DetectorSettings = field(default_factory=DetectorSettings)
    #: Per rank id, its applied-clock record (see the module docstring).
    clocks: dict[str, RankClocks] = field(default_factory=dict)
    _slow: dict[int, deque[float]] = field(default_factory=dict)
    _fast: dict[int, deque[float]] = field(default_factory=dict)
    _ratios: dict[int, deque[float]] = field(default_factory=dict)

    def calibration(self) -> float:
        """The common-mode ratio of observed to planned iteration time (see the module doc)."""
        medians = [statistics.median(r) for r in self._ratios.values() if r]
        return min(medians) if medians else 1.0

    def observe(
        self,
        pipeline: int,
        time: float,
        expected: float,
        flagged: bool,
        current: float | None = None,
    ) -> tuple[DetectorEvent | None, float]:
        """Feed one iteration of ``pipeline``; ``flagged``: whether it is a straggler now;
        ``current``: the T' it is known to run at, in observed seconds (None: not known here,
        e.g. reported by a cluster monitor; then it is never "changed").

        Returns the event (or None) and the current estimate of T' in observed seconds (0 when
        not slow); divide by :meth:`calibration` for the profile's time axis.
        """
        s = self.settings
        n = max(1, s.consecutive)
        ratio = time / expected if expected > 0 else 1.0
        hist = self._ratios.setdefault(pipeline, deque(maxlen=max(CALIBRATION_WINDOW, n)))
        hist.append(ratio)
        c = self.calibration()
        slow = self._slow.setdefault(pipeline, deque(maxlen=n))
        fast = self._fast.setdefault(pipeline, deque(maxlen=n))
        if ratio > c * (1 + s.threshold):
            slow.append(time)
            fast.clear()
        else:
            slow.clear()
            fast.append(ratio)
        t_prime = statistics.median(slow) if slow else 0.0
        if not flagged and len(slow) >= n:
            return DetectorEvent.SLOW, t_prime
        if (
            flagged
            and current
            and len(slow) >= n
            and all(abs(t / current - 1) > s.threshold for t in slow)
        ):
            slow.clear()
            return DetectorEvent.CHANGED, t_prime
        if flagged and len(fast) >= n and sum(fast) / len(fast) <= c * (1 + s.recovery):
            fast.clear()
            return DetectorEvent.RECOVERED, 0.0
        return None, t_prime

    def reset(self, pipeline: int | None = None) -> None:
        if pipeline is None:
            self._slow.clear()
            self._fast.clear()
        else:
            self._slow.pop(pipeline, None)
            self._fast.pop(pipeline, None)


@dataclass
class StageDetector:
    """Per (pipeline, stage) slowdown factors from per-instruction times.

    :meth:`observe` takes one iteration's factor of one stage and returns ``("slow", factor)``,
    ``("recovered", 1.0)``, ``("changed", factor)`` (a slow stage whose factor moved by more than
    the threshold) or ``(None, factor)``.
    """

    settings: DetectorSettings = field(default_factory=DetectorSettings)
    _recent: dict[tuple[int, int], deque[float]] = field(default_factory=dict)
    #: Iterations observed per (pipeline, stage), to decide once every stage has caught up.
    seen: dict[tuple[int, int], int] = field(default_factory=dict)

    def observe(
        self, pipeline: int, stage: int, factor: float, current: float | None
    ) -> tuple[DetectorEvent | None, float]:
        """``current``: the factor the stage is known to be slow by (None when it is not)."""
        s = self.settings
        n = max(1, s.consecutive)
        recent = self._recent.setdefault((pipeline, stage), deque(maxlen=n))
        recent.append(factor)
        self.seen[(pipeline, stage)] = self.seen.get((pipeline, stage), 0) + 1
        if len(recent) < n:
            return None, factor
        mean = sum(recent) / n
        if current is None:
            if all(f > 1 + s.threshold for f in recent):
                recent.clear()
                return DetectorEvent.SLOW, mean
            return None, factor
        if all(f <= 1 + s.recovery for f in recent):
            recent.clear()
            return DetectorEvent.RECOVERED, 1.0
        if all(abs(f / current - 1) > s.threshold for f in recent) and all(
            f > 1 + s.threshold for f in recent
        ):
            recent.clear()
            return DetectorEvent.CHANGED, mean
        return None, factor

    def reset(self, pipeline: int | None = None) -> None:
        if pipeline is None:
            self._recent.clear()
        else:
            for key in [k for k in self._recent if k[0] == pipeline]:
                del self._recent[key]

    def caught_up(self, pipeline: int, count: int) -> bool:
        """Whether every stage of ``pipeline`` seen so far has observed ``count`` iterations."""
        counts = [n for (p, _), n in self.seen.items() if p == pipeline]
        return bool(counts) and min(counts) >= count
