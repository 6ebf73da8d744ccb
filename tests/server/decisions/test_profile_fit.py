"""Smoothing measured times across clocks, and measuring the fastest clocks again."""

from __future__ import annotations

import numpy as np
import pytest

from perseus_server.decisions.profile_fit import smooth_curve
from perseus_server.decisions.profiling_scan import Measurement, ProfilingSession

FREQS = np.arange(1410, 1410 - 15 * 30, -15)


def test_a_smooth_curve_is_averaged_across_clocks() -> None:
    rng = np.random.default_rng(3)
    true = 0.05 + 30.0 / FREQS
    se = np.full(len(FREQS), 0.002 * true)
    measured = true + se * rng.standard_normal(len(FREQS))
    fitted, fitted_se = smooth_curve(FREQS, measured, se)
    assert np.sqrt(np.mean((fitted - true) ** 2)) < 0.5 * np.sqrt(np.mean((measured - true) ** 2))
    assert np.all(fitted_se < se)


def test_a_real_feature_is_kept_and_no_noise_estimate_means_no_smoothing() -> None:
    rng = np.random.default_rng(4)
    true = 0.05 + 30.0 / FREQS
    true[10] *= 0.95  # one clock is 5 % faster than its neighbours (a real GPU's quirk)
    se = np.full(len(FREQS), 0.001 * true)
    measured = true + se * rng.standard_normal(len(FREQS))
    fitted, _ = smooth_curve(FREQS, measured, se)
    assert fitted[10] == pytest.approx(true[10], rel=0.005)
    assert fitted[0] == pytest.approx(true[0], rel=0.003)
    same, _ = smooth_curve(FREQS, measured, np.zeros(len(FREQS)))
    assert np.array_equal(same, measured)
    with pytest.raises(ValueError):
        smooth_curve(FREQS, measured[:-1], se)


def _feed(s: ProfilingSession, times: dict[int, float], energies: dict[int, float]) -> list[int]:
    """One rank, one stage, one instruction; samples alternate +-0.5 % around ``times``."""
    clocks = []
    for version in range(1, 200):
        s.step_version = version
        f = s.frequency
        clocks.append(f)
        while not s.step_complete({"r0"}, 1):
            ms = [
                Measurement("forward", 0, f, times[f] * (1 + 0.005 * (-1) ** i), energies[f])
                for i in range(4)
            ]
            s.record("r0", version, 0.0, ms)
        if s.advance():
            return clocks
    raise AssertionError("the scan never stopped")


def test_a_cheaper_clock_as_fast_as_the_highest_is_measured_again() -> None:
    freqs = [1500, 1450, 1400, 1350]
    # 1450 MHz: 0.1 % slower than 1500 MHz and cheaper; the noise cannot tell them apart.
    times = {1500: 0.1, 1450: 0.1001, 1400: 0.105, 1350: 0.11}
    energies = {1500: 10.0, 1450: 9.5, 1400: 9.0, 1350: 8.5}
    s = ProfilingSession(freqs, 0, 2, 3, tolerance=0.01, max_revisits=4, smooth=False)
    clocks = _feed(s, times, energies)
    assert clocks[:4] == freqs and s.revisited and set(s.revisited) <= {1500, 1450}
    assert len(clocks) == 4 + len(s.revisited) <= 8
    assert s.iterations_spent == 4 + 2 * len(s.revisited)
    # The revisits' samples were added to the scan's, and a stored session keeps them.
    stats = dict(s.stats()[(0, "forward")])
    assert stats[1500].n + stats[1450].n == 4 * (2 + 2 * len(s.revisited))
    again = ProfilingSession.from_json(s.to_json())
    assert again.to_json() == s.to_json() and again.revisited == s.revisited


def test_nothing_is_measured_again_without_a_tolerance_or_a_revisit_budget() -> None:
    freqs = [1500, 1450, 1400]
    times = {1500: 0.1, 1450: 0.1001, 1400: 0.105}
    energies = {1500: 10.0, 1450: 9.5, 1400: 9.0}
    for kw in ({"tolerance": 0.0, "max_revisits": 4}, {"tolerance": 0.01, "max_revisits": 0}):
        s = ProfilingSession(freqs, 0, 2, 3, **kw)  # type: ignore[arg-type]
        assert _feed(s, times, energies) == freqs and not s.revisited
