"""Power floors (``perseus.power.floors``).

The floors' timeline is checked against an independent reading: each rank's power sampled with
its floors applied (``max(p_r(t), floor)``), summed, and the bounds read off the samples. The
least floors are checked to be least by comparing with the two floor-only references and with
lowering any single floor level (which must break a bound).
"""

from __future__ import annotations

import numpy as np
import pytest

from perseus.frontier import Frontier
from perseus.power import (
    SwingBounds,
    least_floors,
    trough_fill_energy,
    uniform_floor,
)
from perseus.power.floors import meets
from perseus.power_timeline import RankPower, rank_power
from perseus.problem import EnergyProblem

BOUNDS = SwingBounds(0.30, 0.12)


def sampled_with_floors(
    ranks: RankPower, floors: list[list[tuple[float, float, float]]], dt: float
) -> np.ndarray:
    """Every rank's power with its floors, sampled every ``dt``, summed."""
    period = float(ranks.times[-1])
    t = (np.arange(int(period / dt)) + 0.5) * dt
    k = np.searchsorted(ranks.times, t, side="right") - 1
    power = ranks.watts[:, k].copy()
    for r, spans in enumerate(floors):
        for s, e, w in spans:
            on = (t >= s) & (t < e)
            power[r, on] = np.maximum(power[r, on], w)
    return power.sum(axis=0)


def test_least_floors_meet_the_bounds_on_an_independent_reading(
    swing_problem: EnergyProblem, swing_frontier: Frontier
) -> None:
    dt = 1e-5
    for plan in (
        swing_problem.max_frequency_plan(),
        swing_frontier.plans[0],
        swing_frontier.plans[-1],
    ):
        rp = rank_power(swing_problem, plan)
        fl = least_floors(rp, BOUNDS)
        samples = sampled_with_floors(rp, fl.ranks, dt)
        assert fl.timeline.energy == pytest.approx(samples.sum() * dt, rel=1e-3)
        assert fl.energy == pytest.approx(fl.timeline.energy - rp.total().energy, rel=1e-9)
        peak = samples.max()
        assert peak == pytest.approx(rp.total().peak, rel=1e-9)  # floors never raise the peak
        assert 1 - samples.min() / peak <= 0.30 + 1e-6
        k = int(round(0.1 / dt))
        ext = np.concatenate([samples, samples[:k]])
        win = np.lib.stride_tricks.sliding_window_view(ext, k)[: len(samples)]
        assert (win.max(axis=1) - win.min(axis=1)).max() <= 0.12 * peak * (1 + 1e-3)
        assert meets(fl.timeline, BOUNDS)


def test_least_floors_are_least(swing_problem: EnergyProblem, swing_frontier: Frontier) -> None:
    rp = rank_power(swing_problem, swing_frontier.plans[0])
    fl = least_floors(rp, BOUNDS)
    level, uniform_j = uniform_floor(rp, BOUNDS)
    assert 0 < fl.energy < uniform_j
    # Swing only: the least floors are exactly the trough filled where needed.
    swing_only = least_floors(rp, SwingBounds(max_swing=0.30))
    assert swing_only.energy == pytest.approx(trough_fill_energy(rp, 0.30), rel=1e-6)
    assert fl.energy >= swing_only.energy - 1e-6
    # Lowering the highest-energy floor span by 2 % breaks a bound.
    r, i = max(
        ((r, i) for r, spans in enumerate(fl.ranks) for i in range(len(spans))),
        key=lambda ri: fl.ranks[ri[0]][ri[1]][1] - fl.ranks[ri[0]][ri[1]][0],
    )
    lowered = [list(spans) for spans in fl.ranks]
    s, e, w = lowered[r][i]
    for rr in range(len(lowered)):  # the level is every rank's there: lower it on all
        lowered[rr] = [(a, b, 0.98 * x if (a, b) == (s, e) else x) for a, b, x in lowered[rr]]
    dt = 1e-5
    samples = sampled_with_floors(rp, lowered, dt)
    k = int(round(0.1 / dt))
    win = np.lib.stride_tricks.sliding_window_view(np.concatenate([samples, samples[:k]]), k)
    swing = 1 - samples.min() / samples.max()
    ramp = (win.max(axis=1) - win.min(axis=1)).max() / samples.max()
    assert swing > 0.30 + 1e-6 or ramp > 0.12 + 1e-6
