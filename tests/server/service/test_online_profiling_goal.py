"""The online-profiling goal on small jobs (the CI-short form of ``benchmarks/profiling.py``).

Seeded simulated GPUs that follow the shipped profiles with realistic measurement noise.
"""

from __future__ import annotations

import pytest

from benchmarks.profiling import run_job

#: time and energy noise (relative standard deviations) of the benchmark's default
NOISE, ENERGY_NOISE = 0.005, 0.015


@pytest.mark.parametrize(("gpu", "stages"), [("a100", 2), ("a40", 3)])
def test_the_zero_slowdown_plan_of_a_noisy_scan_saves_what_the_true_profiles_does(
    gpu: str, stages: int
) -> None:
    """At T0 the plan from a noisy scan saves within 0.1 point of the true profile's.

    At T0 the plan from the measured profile saves within 0.1 point of the true profile's and is
    not late by more than a few hundredths of a percent: before the fastest clocks were measured
    again and the times smoothed, a clock whose time read as fast as the highest clock's by
    noise was taken and the plan ran 0.1-0.2 % late (0.5-1 point off).
    """
    _, ref, res = run_job(
        gpu,
        stages,
        6,
        noise=NOISE,
        energy_noise=ENERGY_NOISE,
        seed=1,
        tolerance=0.005,
        rules=("new",),
    )
    scan, got = res["new"]
    assert abs(got.points[0] - ref.points[0]) <= 0.1, (got.points, ref.points)
    assert got.late[0] <= 0.1
    # Every deadline stays close, and the scan went down to the valleys.
    assert max(abs(a - b) for a, b in zip(got.points, ref.points, strict=True)) <= 0.3
    assert scan.lowest_clock <= 870
