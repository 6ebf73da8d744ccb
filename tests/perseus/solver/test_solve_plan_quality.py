"""How good the plans are, not only how honest the bound is.

The gap of the frontier's plans to the certified bound, at several deadlines and over the whole
range, on both shipped profiles and every schedule kind.

The solver is deterministic, so each case's gaps are fixed numbers; the budgets below are those
measured (2026-12-01) with a margin: the five deadlines within the issue's 0.5 %, the worst gap
over the range within 1.2 times, the mean gap within 1.04 times what was measured. A seeded bug
that rounds each relaxed duration towards the *farther* hull vertex (``up_at`` read from the
wrong end in ``perseus.kernels.rounding._round``) raised the mean gap by 6-16 % in all six cases
and the worst by 5-63 % (reclaiming and refining hide most of it, which is why a single
threshold once caught it only by luck); each case's mean budget fails under it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perseus.problem import EnergyProblem
from perseus.profiles import load_profile
from perseus.schedules import Schedule, gpipe, interleaved_1f1b, one_f_one_b
from perseus.solver import solve_problem

PROFILES = Path(__file__).resolve().parents[3] / "profiles"
A100 = (PROFILES / "gpt3-175b_a100-sxm_8stage.csv", 83.64)
A40 = (PROFILES / "gpt3-175b_a40_8stage.csv", 70.38)
DEADLINES = (1.0, 1.02, 1.05, 1.1, 1.2)
AT_DEADLINES = 0.005

# (profile, schedule, worst gap over the range, mean gap over the range), as measured
CASES: dict[str, tuple[tuple[Path, float], Schedule, float, float]] = {
    "a100-1f1b-8x8": (A100, one_f_one_b(8, 8), 0.00160, 0.000655),
    "a40-1f1b-8x8": (A40, one_f_one_b(8, 8), 0.00356, 0.000954),
    "a100-gpipe-8x6": (A100, gpipe(8, 6), 0.00164, 0.000769),
    "a40-gpipe-8x6": (A40, gpipe(8, 6), 0.00411, 0.001173),
    "a100-interleaved-4x8v2": (A100, interleaved_1f1b(4, 8, 2), 0.00098, 0.000402),
    "a40-interleaved-4x8v2": (A40, interleaved_1f1b(4, 8, 2), 0.00236, 0.000465),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_plans_stay_close_to_the_bound(name: str) -> None:
    (path, power), schedule, worst, mean = CASES[name]
    problem = EnergyProblem.build(load_profile(path), schedule, power)
    fr = solve_problem(problem)
    t0 = fr.max_frequency_time
    assert fr.times[0] <= t0 * (1 + 1e-12)  # the fastest plan is a zero-slowdown plan

    def gap(d: float) -> float:
        return fr.energy_at(d) / fr.lower_bound_at(d) - 1

    at = {f: gap(f * t0) for f in DEADLINES}
    assert max(at.values()) <= AT_DEADLINES, at
    grid = np.linspace(t0, float(fr.times[-1]), 400)
    gaps = np.array([gap(float(d)) for d in grid])
    assert gaps.min() >= -1e-9  # no plan below the bound
    assert gaps.max() <= 1.2 * worst, (gaps.max(), worst)
    assert gaps.mean() <= 1.04 * mean, (gaps.mean(), mean)
