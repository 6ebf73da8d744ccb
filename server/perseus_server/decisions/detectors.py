"""Straggler detection from reported iteration times, with hysteresis.

Also slow-stage detection from reported per-instruction times.

**Pipelines.** Each reported iteration of a data-parallel pipeline gives a ratio ``observed /
planned`` (the planned time of the plan version the iteration ran). A real run never matches the
profile exactly (communication, launch overheads), and that overhead is common to every pipeline,
so ratios are compared against the job's *calibration* ``c``: the smallest, over the pipelines, of
the median of their last few ratios (the healthiest pipeline's overhead; 1 before any report). A
pipeline is a straggler when its ratio exceeds ``c * (1 + threshold)`` (default 5 %) for
``consecutive`` iterations in a row (default 3); its observed time T' is the median of those
iterations: the first of them often straddles the moment the pipeline slowed down, and the
median does not let it drag T' below the new pace. On the profile's time axis T' is ``T' - o``,
where ``o`` is the same healthiest pipeline's overhead in seconds (the median of its last few
excesses of observed over planned time): the overhead is mostly a cost per iteration that a
slower plan does not lengthen (the data-parallel reduction, the optimizer step, launches, waits
for the host), so it is taken out as seconds, not as the ratio ``c``. Taken out as a ratio, it
made T' on the profile's axis too short by the overhead's share of the slowdown: the pipelines
that follow a straggler ran up to 2.3 % faster than it on a loaded machine, where the overhead
was 5 % (``docs/results/2026-12-02-overhead.md``). While it is a
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
pipeline recovers by the rule above. An iteration that ran off-plan gives no slow-stage factors
(its stages are slow because of their clocks): slow stages are found from on-plan iterations.

**The statistics** (the median, the calibration, the stage factor) are those of
:mod:`perseus_server.decisions.report_statistics`, each defined once there.

**Who scales by the calibration.** Only the detector: a caller gives it raw measured seconds
and the planned time, and gets back decisions whose T' is on the profile's time axis (the
planned times' axis), and takes the T' it already knows on that axis too (see :class:`Detector`).

**Stages.** Per-instruction times reported by a rank, divided by the profile's time for that
instruction at the clock it ran at, give each stage's slowdown factor for one iteration (the
median over its instructions: :func:`~perseus_server.decisions.report_statistics.stage_factors`,
for a report's rows and its columns alike). A stage whose factor exceeds ``1 + threshold`` for
``consecutive`` iterations is slow with the median factor of those iterations, as a straggler's
T' is their median: the first of them may be an iteration before the slowdown that the host
held up past the threshold (a link's transfer of a few milliseconds needs only a fraction of a
millisecond), and a mean let it drag the factor below the new pace (a link slowed 4x flagged at
3.07x: ``docs/results/2026-12-07-demo-timing.md``); it recovers once its factor is within
``1 + recovery`` for ``consecutive`` iterations.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from perseus_server.decisions.report_statistics import calibration, median, overhead
from perseus_server.domain.bounds import MAX_SECONDS
from perseus_server.domain.states import DetectorEvent

__all__ = [
    "DETECTORS",
    "Decision",
    "Detector",
    "DetectorSettings",
    "OFF_PLAN_WINDOW",
    "RankClocks",
    "StageDetector",
    "StragglerDetector",
    "make_detectors",
]

#: Iterations per pipeline kept for the calibration median.
CALIBRATION_WINDOW = 5
#: A rank's latest reported iterations in which an off-plan instruction makes it off-plan.
OFF_PLAN_WINDOW = 16


@dataclass
class RankClocks:
    """A rank's applied-clock record.

    Per iteration of the window ``(iteration, off-plan instructions, reasons seen in them,
    samples)``, the all-time count, and the latest off-plan instruction (a JSON-ready dict with
    its iteration).
    """

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
    """The detectors' settings, the one place they are named.

    Set by ``PUT /jobs/{id}/straggler-detection``. Built by keyword (:meth:`from_json`), stored
    and shown as :meth:`to_json`.
    """

    #: A pipeline (stage) is slow beyond ``calibration * (1 + threshold)`` (``1 + threshold``).
    threshold: float = 0.05
    #: Iterations in a row that decide.
    consecutive: int = 3
    #: Recovered within ``calibration * (1 + recovery)`` (``1 + recovery``).
    recovery: float = 0.02

    def to_json(self) -> dict[str, Any]:
        """The settings as a document of their fields by name."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DetectorSettings:
        """Settings from a document of their fields by name.

        Missing fields take the defaults; unknown ones raise a :class:`ValueError` naming
        them.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - names)
        if unknown:
            raise ValueError(f"unknown detector setting(s): {', '.join(unknown)}")
        return cls(**{k: doc[k] for k in names if k in doc})


class Decision(NamedTuple):
    """What one observed iteration decided for its pipeline."""

    #: ``slow`` / ``changed`` / ``recovered``, or None: nothing changed.
    event: DetectorEvent | None
    #: T', the pipeline's iteration time on the profile's time axis (the planned times'
    #: axis, the common overhead's seconds taken out); 0 when it is not slow.
    time: float


class Detector(Protocol):
    """Straggler detection over a job's data-parallel pipelines, from reported iteration times.

    The detector owns its calibration (the common overhead between measured and planned
    times): callers pass raw measured seconds and the planned time, and get decisions whose T'
    is on the profile's time axis; the T' they know (``current``) is on that axis too. Nobody
    else scales by the calibration. One contract suite
    (``tests/server/decisions/test_detectors.py``) runs against every implementation in
    :data:`DETECTORS`.
    """

    settings: DetectorSettings
    #: Per rank id, its applied-clock record (kept when the settings change).
    clocks: dict[str, RankClocks]

    def calibration(self) -> float:
        """The common overhead, observed / planned (1 before any report); for the status."""
        ...

    def observe(
        self,
        pipeline: int,
        time: float,
        expected: float,
        flagged: bool,
        current: float | None = None,
    ) -> Decision:
        """Feed one iteration of ``pipeline`` that took ``time`` seconds (measured).

        Its plan takes ``expected``. ``flagged``: whether it is a straggler now;
        ``current``: the T' it is known to run at, on the profile's axis (None: not known
        here, e.g. reported by a cluster monitor; then its pace never "changed").
        """
        ...

    def explain(self, pipeline: int, expected: float) -> str:
        """The last ``slow`` or ``changed`` decision on ``pipeline``, in words.

        For the replan log and the status; measured and on the profile's axis.
        """
        ...

    def reset(self, pipeline: int | None = None) -> None:
        """Forget the slow and recovering runs of one pipeline (every pipeline: None)."""


@dataclass
class StragglerDetector:
    """The :class:`Detector` of the module docstring.

    Per-pipeline runs of slow and fast iterations against the calibration, with hysteresis.
    """

    settings: DetectorSettings = field(default_factory=DetectorSettings)
    #: Per rank id, its applied-clock record (see the module docstring).
    clocks: dict[str, RankClocks] = field(default_factory=dict)
    _slow: dict[int, deque[float]] = field(default_factory=dict)
    _fast: dict[int, deque[float]] = field(default_factory=dict)
    _ratios: dict[int, deque[float]] = field(default_factory=dict)
    #: Per pipeline, the same iterations' excesses of observed over planned time (seconds).
    _excess: dict[int, deque[float]] = field(default_factory=dict)
    #: Per pipeline, its last slow/changed decision in measured seconds: (event, T', the
    #: calibration and the overhead it was compared with, the T' it was before), for
    #: :meth:`explain`.
    _last: dict[int, tuple[DetectorEvent, float, float, float, float | None]] = field(
        default_factory=dict
    )

    def calibration(self) -> float:
        """The common-mode ratio of observed to planned iteration time (see the module doc)."""
        c = calibration(self._ratios.values())
        return 1.0 if c is None else c

    def overhead(self) -> float:
        """The common overhead in seconds, the healthiest pipeline's (0 before any report)."""
        return self._common()[1]

    def _common(self) -> tuple[float, float]:
        """The calibration and the overhead in seconds, in one pass (``(1, 0)`` before reports)."""
        h = overhead((self._ratios[p], self._excess.get(p, ())) for p in self._ratios)
        return (1.0, 0.0) if h is None else h

    def observe(
        self,
        pipeline: int,
        time: float,
        expected: float,
        flagged: bool,
        current: float | None = None,
    ) -> Decision:
        """See :meth:`Detector.observe`."""
        # The known T' in measured seconds, at the overhead before this iteration counts.
        c, o = self._common()
        known = _measured(current, o, c) if current else None
        event, t_prime = self._observe(pipeline, time, expected, flagged, known)
        c, o = self._common()
        if event in (DetectorEvent.SLOW, DetectorEvent.CHANGED):
            assert event is not None
            self._last[pipeline] = (event, t_prime, c, o, known)
        return Decision(event, _on_axis(t_prime, o, c))

    def explain(self, pipeline: int, expected: float) -> str:
        """See :meth:`Detector.explain`."""
        event, t_prime, c, o, known = self._last[pipeline]
        on_axis = f"T'={_on_axis(t_prime, o, c):.4g} s on the profile's axis"
        if event is DetectorEvent.SLOW:
            return (
                f"pipeline {pipeline} detected slow: {t_prime:.4g} s per iteration vs "
                f"{expected:.4g} s planned (x{c:.3f}, {1000 * o:+.4g} ms common overhead: "
                f"{on_axis})"
            )
        return (
            f"pipeline {pipeline} pace changed: {t_prime:.4g} s per iteration, was "
            f"{known:.4g} s ({on_axis})"
        )

    def _observe(
        self,
        pipeline: int,
        time: float,
        expected: float,
        flagged: bool,
        current: float | None,
    ) -> tuple[DetectorEvent | None, float]:
        """The rule of the module docstring in measured seconds (``current`` too)."""
        s = self.settings
        n = max(1, s.consecutive)
        ratio = time / expected if expected > 0 else 1.0
        window = max(CALIBRATION_WINDOW, n)
        self._ratios.setdefault(pipeline, deque(maxlen=window)).append(ratio)
        self._excess.setdefault(pipeline, deque(maxlen=window)).append(
            time - expected if expected > 0 else 0.0
        )
        c = self.calibration()
        slow = self._slow.setdefault(pipeline, deque(maxlen=n))
        fast = self._fast.setdefault(pipeline, deque(maxlen=n))
        if ratio > c * (1 + s.threshold):
            slow.append(time)
            fast.clear()
        else:
            slow.clear()
            fast.append(ratio)
        t_prime = median(slow) if slow else 0.0
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
        """Forget the runs of slow and fast iterations of ``pipeline`` (None: of every pipeline)."""
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
        middle = median(recent)
        if current is None:
            if all(f > 1 + s.threshold for f in recent):
                recent.clear()
                return DetectorEvent.SLOW, middle
            return None, factor
        if all(f <= 1 + s.recovery for f in recent):
            recent.clear()
            return DetectorEvent.RECOVERED, 1.0
        if all(abs(f / current - 1) > s.threshold for f in recent) and all(
            f > 1 + s.threshold for f in recent
        ):
            recent.clear()
            return DetectorEvent.CHANGED, middle
        return None, factor

    def reset(self, pipeline: int | None = None) -> None:
        """Forget the recent stage factors of ``pipeline`` (None: of every pipeline)."""
        if pipeline is None:
            self._recent.clear()
        else:
            for key in [k for k in self._recent if k[0] == pipeline]:
                del self._recent[key]

    def caught_up(self, pipeline: int, count: int) -> bool:
        """Whether every stage of ``pipeline`` seen so far has observed ``count`` iterations."""
        counts = [n for (p, _), n in self.seen.items() if p == pipeline]
        return bool(counts) and min(counts) >= count


def _on_axis(t_prime: float, overhead: float, calibration: float) -> float:
    """A measured T' on the profile's time axis: ``overhead`` seconds taken out (0: not slow).

    A T' no longer than the overhead (a profile that does not describe the job, before the
    mismatch check has seen enough of it) is divided by the ``calibration`` instead. A
    calibration from iterations far faster than their plan would put T' past any time a report
    may carry: it is never longer than MAX_SECONDS.
    """
    if t_prime <= 0:
        return 0.0
    t = t_prime - overhead if t_prime > overhead else t_prime / calibration
    return min(t, MAX_SECONDS)


def _measured(t: float, overhead: float, calibration: float) -> float:
    """A T' on the profile's axis in measured seconds: :func:`_on_axis`'s inverse."""
    return t + overhead if t + overhead > 0 else t * calibration


#: Every :class:`Detector` implementation (the contract suite runs over each).
DETECTORS: tuple[type[StragglerDetector], ...] = (StragglerDetector,)


def make_detectors(
    settings: DetectorSettings, clocks: dict[str, RankClocks] | None = None
) -> tuple[Detector, StageDetector]:
    """A job's pipeline detector and stage detector, from one settings value.

    ``clocks``: the ranks' applied-clock records to keep.
    """
    return StragglerDetector(settings, {} if clocks is None else clocks), StageDetector(settings)
