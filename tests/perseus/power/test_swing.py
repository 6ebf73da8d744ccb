"""Power floors and swing-bounded plans (``perseus.power.floors``, ``perseus.power.swing``).

The floors' timeline is checked against an independent reading: each rank's power sampled
with its floors applied (``max(p_r(t), floor)``), summed, and the bounds read off the samples.
The least floors are checked to be least by comparing with the two floor-only references and
with lowering any single floor level (which must break a bound).
"""

from __future__ import annotations

import numpy as np
import pytest

from perseus.errors import OptionError
from perseus.frontier import Frontier
from perseus.power import (
    SwingBounds,
    SwingError,
    least_floors,
    plan_for_swing,
    swing_of,
    trough_fill_energy,
    uniform_floor,
)
from perseus.power.floors import meets
from perseus.power_timeline import RankPower, rank_power
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import solve_problem

BLOCKING = 83.64
BOUNDS = SwingBounds(0.30, 0.12)


@pytest.fixture(scope="module")
def problem(slice_profile) -> EnergyProblem:
    prof = slice_profile([0, 2, 5, 7], {1410, 1305, 1200, 1095, 990, 855})
    return EnergyProblem.build(prof, one_f_one_b(4, 6), BLOCKING)


@pytest.fixture(scope="module")
def frontier(problem: EnergyProblem) -> Frontier:
    return solve_problem(problem)


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
    problem: EnergyProblem, frontier: Frontier
) -> None:
    dt = 1e-5
    for plan in (problem.max_frequency_plan(), frontier.plans[0], frontier.plans[-1]):
        rp = rank_power(problem, plan)
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


def test_least_floors_are_least(problem: EnergyProblem, frontier: Frontier) -> None:
    rp = rank_power(problem, frontier.plans[0])
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


def test_plan_for_swing_beats_the_plan_plus_floors(
    problem: EnergyProblem, frontier: Frontier
) -> None:
    t0 = frontier.max_frequency_time
    sp = plan_for_swing(frontier, problem, BOUNDS, t0, pipelines=2, tensor_parallel=3)
    assert sp.time <= t0 * (1 + 1e-12)
    assert problem.evaluate(sp.plan).time == pytest.approx(sp.time)
    rp = rank_power(problem, frontier.plans[0])
    plain = rp.total().energy + least_floors(rp, BOUNDS).energy
    assert sp.energy <= 6 * plain * (1 + 1e-9)
    assert sp.energy == pytest.approx(6 * (sp.plan_energy + sp.floors.energy))
    assert meets(sp.timeline, BOUNDS)
    doc = sp.to_json()
    assert len(doc["power_floors"]) == 4
    assert all(0 <= s < e <= sp.time + 1e-9 and w > 0 for r in doc["power_floors"] for s, e, w in r)
    # A looser deadline can only help.
    slow = plan_for_swing(frontier, problem, BOUNDS, 1.2 * t0, local=False)
    fast = plan_for_swing(frontier, problem, BOUNDS, t0, local=False)
    assert slow.energy <= fast.energy + 1e-9


def test_swing_error_names_the_least_swing(problem: EnergyProblem, frontier: Frontier) -> None:
    t0 = frontier.max_frequency_time
    with pytest.raises(SwingError, match="least swing reachable is") as err:
        plan_for_swing(frontier, problem, SwingBounds(0.05, None), t0, max_floor=120.0)
    assert err.value.least_swing is not None
    assert 0.05 < err.value.least_swing < swing_of(problem, frontier.plans[0])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_swing": -0.1}, "max_swing"),
        ({"max_swing": float("nan")}, "max_swing"),
        ({"max_ramp": 1.5}, "max_ramp"),
        ({"max_ramp": 0.1, "window": 0.0}, "window"),
        ({"max_ramp": 0.1, "window": float("inf")}, "window"),
    ],
)
def test_bad_bounds_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(OptionError, match=field) as err:
        SwingBounds(**kwargs)
    assert err.value.field == field
