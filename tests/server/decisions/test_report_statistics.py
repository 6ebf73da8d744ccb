"""The statistics the report observers share, against the standard library's.

The statistics are :mod:`perseus_server.decisions.report_statistics`; also the callers that reach
them: the straggler detector's calibration and the profile check's ratio are one statistic.
"""

from __future__ import annotations

import statistics
from collections import deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perseus_server.decisions.detectors import StragglerDetector
from perseus_server.decisions.report_statistics import (
    calibration,
    link_time,
    median,
    overhead,
    stage_factors,
)

values = st.lists(st.floats(1e-6, 1e6, allow_nan=False), min_size=1, max_size=40)


@given(values)
def test_the_median_is_the_standard_one_for_lists_and_arrays(xs: list[float]) -> None:
    want = statistics.median(xs)
    assert median(xs) == pytest.approx(want, rel=1e-15)
    assert median(np.asarray(xs)) == pytest.approx(want, rel=1e-15)
    assert median(iter(xs)) == pytest.approx(want, rel=1e-15)
    assert type(median(np.asarray(xs))) is float


@given(st.lists(values, min_size=1, max_size=6), st.integers(1, 5))
def test_the_calibration_is_the_smallest_median_of_the_full_windows(
    windows: list[list[float]], full: int
) -> None:
    full_ones = [statistics.median(w) for w in windows if len(w) >= full]
    got = calibration([deque(w) for w in windows], full=full)
    assert got == (min(full_ones) if full_ones else None)


def test_the_calibration_of_nothing_is_none() -> None:
    assert calibration([]) is None and calibration([[]]) is None
    assert calibration([[2.0, 9.0, 3.0], [1.5]]) == 1.5


def test_stage_factors_and_link_times_are_medians() -> None:
    got = stage_factors({3: [1.0, 2.0, 4.0], 1: np.array([1.1, 1.3])})
    assert list(got) == [3, 1]  # the stages in the order given
    assert got == {3: 2.0, 1: pytest.approx(1.2)}
    assert link_time([0.003, 0.001, 0.002, 0.010]) == (pytest.approx(0.0025), 0.001)


def test_the_detector_calibrates_by_the_shared_statistic() -> None:
    det = StragglerDetector()
    for p, ratios in {0: [1.2, 1.1, 1.3], 1: [1.05, 1.4, 1.0]}.items():
        for r in ratios:
            det.observe(p, r, 1.0, flagged=False)
    assert det.calibration() == calibration([[1.2, 1.1, 1.3], [1.05, 1.4, 1.0]]) == 1.05


@given(st.lists(st.tuples(values, values), min_size=1, max_size=6))
def test_the_overhead_is_the_median_excess_of_the_calibrations_pipeline(
    windows: list[tuple[list[float], list[float]]],
) -> None:
    healthiest = min(windows, key=lambda w: statistics.median(w[0]))
    got = overhead(windows)
    assert got is not None
    # its ratio is the calibration, its seconds the median excess of that pipeline
    assert got[0] == calibration([w[0] for w in windows])
    assert got[1] == pytest.approx(statistics.median(healthiest[1]), rel=1e-15)


def test_the_overhead_of_nothing_is_none() -> None:
    assert overhead([]) is None and overhead([([], [])]) is None
    # the pipeline of the smallest median ratio (1.1), not the smallest excess (0.1)
    assert overhead([([1.3, 1.5], [0.1, 0.1]), ([1.1], [0.4])]) == (1.1, 0.4)
