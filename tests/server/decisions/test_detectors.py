"""The detector contract, run against every implementation.

The :class:`~perseus_server.decisions.detectors.Detector` contract, run against every implementation
in :data:`~perseus_server.decisions.detectors.DETECTORS`: the detector owns its calibration (callers
give raw measured seconds and get T' on the profile's axis; the T' they know is on that axis too),
detects, follows a changed pace, recovers and forgets; and the settings are one dataclass, built by
keyword, that the REST body mirrors field for field.
"""

from __future__ import annotations

import pytest

from perseus_server.decisions.detectors import (
    DETECTORS,
    Decision,
    Detector,
    DetectorSettings,
    StageDetector,
    make_detectors,
)
from perseus_server.domain.bounds import MAX_SECONDS
from perseus_server.domain.states import DetectorEvent
from perseus_server.rest.stragglers import DetectionIn

#: Planned iteration time (the profile's axis).
PLANNED = 2.0
#: The common overhead every pipeline runs with, in seconds per iteration (a fixed cost: a
#: slower plan does not lengthen it).
EXTRA = 0.6
#: The same as a ratio at the planned time (measured / planned): the calibration.
OVERHEAD = (PLANNED + EXTRA) / PLANNED


@pytest.fixture(params=DETECTORS, ids=[d.__name__ for d in DETECTORS])
def detector(request: pytest.FixtureRequest) -> Detector:
    det: Detector = request.param(DetectorSettings(threshold=0.05, consecutive=3, recovery=0.02))
    return det


def _warm(det: Detector, pipelines: int = 3, n: int = 5) -> None:
    """Every pipeline at the common overhead for a while: the calibration learns it."""
    for _ in range(n):
        for p in range(pipelines):
            assert det.observe(p, PLANNED + EXTRA, PLANNED, False).event is None


def _feed(det: Detector, p: int, slowdown: float, n: int, **kw: object) -> list[Decision]:
    """``n`` iterations of pipeline ``p`` at ``slowdown`` on the profile's axis.

    Measured: with the overhead's seconds; the other pipelines keep the common pace.
    """
    out = []
    for _ in range(n):
        out.append(det.observe(p, slowdown * PLANNED + EXTRA, PLANNED, **kw))  # type: ignore[arg-type]
        for q in (0, 2):
            det.observe(q, PLANNED + EXTRA, PLANNED, False)
    return out


def test_a_common_overhead_is_no_straggler(detector: Detector) -> None:
    _warm(detector, n=10)
    assert detector.calibration() == pytest.approx(OVERHEAD)


def test_a_straggler_is_detected_with_t_prime_on_the_profiles_axis(detector: Detector) -> None:
    _warm(detector)
    decisions = _feed(detector, 1, 1.2, 3, flagged=False)
    assert [d.event for d in decisions] == [None, None, DetectorEvent.SLOW]
    # T' = 1.2 x the plan, the overhead taken out by the detector itself.
    assert decisions[-1].time == pytest.approx(1.2 * PLANNED)
    why = detector.explain(1, PLANNED)
    assert "detected slow" in why and f"T'={1.2 * PLANNED:.4g} s on the profile's axis" in why
    assert f"{1.2 * PLANNED + EXTRA:.4g} s per iteration" in why


def test_a_known_pace_is_given_on_the_profiles_axis(detector: Detector) -> None:
    """The straggler runs at the T' it is known by (profile's axis).

    Not a changed pace, though its measured time is the overhead's 0.6 s above that T'.
    """
    _warm(detector)
    known = 1.2 * PLANNED
    decisions = _feed(detector, 1, 1.2, 6, flagged=True, current=known)
    assert all(d.event is None for d in decisions)


def test_a_changed_pace_is_followed(detector: Detector) -> None:
    _warm(detector)
    decisions = _feed(detector, 1, 1.5, 3, flagged=True, current=1.2 * PLANNED)
    assert decisions[-1].event is DetectorEvent.CHANGED
    assert decisions[-1].time == pytest.approx(1.5 * PLANNED)
    assert "pace changed" in detector.explain(1, PLANNED)


def test_a_pace_told_by_no_one_never_changes(detector: Detector) -> None:
    _warm(detector)
    decisions = _feed(detector, 1, 1.5, 6, flagged=True)
    assert all(d.event is None for d in decisions)


def test_a_straggler_recovers_with_hysteresis(detector: Detector) -> None:
    _warm(detector)
    _feed(detector, 1, 1.2, 3, flagged=False)
    # Back within the threshold but not within the recovery margin: still a straggler.
    assert all(d.event is None for d in _feed(detector, 1, 1.04, 6, flagged=True))
    # Recovered once the mean of the last three is within the margin: (1.04 + 1 + 1) / 3.
    decisions = _feed(detector, 1, 1.0, 2, flagged=True)
    assert [d.event for d in decisions] == [None, DetectorEvent.RECOVERED]
    assert decisions[-1].time == 0.0


def test_t_prime_stays_within_the_report_bounds(detector: Detector) -> None:
    """Pipelines reporting iterations a million times faster than planned make a tiny calibration.

    A pipeline at the slowest time a report may carry must still get a T' a report could carry
    (found by the report-bounds property test: T' = 1.9e12 s).
    """
    for _ in range(5):
        for p in (0, 2):
            detector.observe(p, 1e-6, PLANNED, False)
    decisions = [detector.observe(1, MAX_SECONDS, PLANNED, False) for _ in range(3)]
    assert decisions[-1].event is DetectorEvent.SLOW
    assert 0 < decisions[-1].time <= MAX_SECONDS


def test_reset_forgets_a_run_in_progress(detector: Detector) -> None:
    _warm(detector)
    _feed(detector, 1, 1.2, 2, flagged=False)
    detector.reset(1)
    assert [d.event for d in _feed(detector, 1, 1.2, 3, flagged=False)][-1] is DetectorEvent.SLOW
    _feed(detector, 1, 1.2, 2, flagged=False)
    detector.reset()
    assert _feed(detector, 1, 1.2, 1, flagged=False)[-1].event is None


def test_settings_are_one_dataclass_built_by_keyword() -> None:
    s = DetectorSettings.from_json({"threshold": 0.1, "consecutive": 5, "recovery": 0.05})
    assert s == DetectorSettings(threshold=0.1, consecutive=5, recovery=0.05)
    assert DetectorSettings.from_json(s.to_json()) == s
    assert DetectorSettings.from_json({}) == DetectorSettings()
    with pytest.raises(ValueError, match="window"):
        DetectorSettings.from_json({"window": 3})
    # The REST body has exactly the settings' fields, with the same defaults.
    assert DetectionIn().model_dump() == DetectorSettings().to_json()
    det, stages = make_detectors(s, {"r": None})  # type: ignore[dict-item]
    assert det.settings == s and isinstance(stages, StageDetector) and stages.settings == s
    assert list(det.clocks) == ["r"]
