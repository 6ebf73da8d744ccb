"""Swing-bounded plans (``perseus.power.swing``).

The plan for a swing bound against the frontier's plan with its least floors added, the error
naming the least swing reachable, and bad bounds named by field.
"""

from __future__ import annotations

import pytest

from perseus.errors import OptionError
from perseus.frontier import Frontier
from perseus.power import (
    SwingBounds,
    SwingError,
    least_floors,
    plan_for_swing,
    swing_of,
)
from perseus.power.floors import meets
from perseus.power_timeline import rank_power
from perseus.problem import EnergyProblem

BOUNDS = SwingBounds(0.30, 0.12)


def test_plan_for_swing_beats_the_plan_plus_floors(
    swing_problem: EnergyProblem, swing_frontier: Frontier
) -> None:
    t0 = swing_frontier.max_frequency_time
    sp = plan_for_swing(swing_frontier, swing_problem, BOUNDS, t0, pipelines=2, tensor_parallel=3)
    assert sp.time <= t0 * (1 + 1e-12)
    assert swing_problem.evaluate(sp.plan).time == pytest.approx(sp.time)
    rp = rank_power(swing_problem, swing_frontier.plans[0])
    plain = rp.total().energy + least_floors(rp, BOUNDS).energy
    assert sp.energy <= 6 * plain * (1 + 1e-9)
    assert sp.energy == pytest.approx(6 * (sp.plan_energy + sp.floors.energy))
    assert meets(sp.timeline, BOUNDS)
    doc = sp.to_json()
    assert len(doc["power_floors"]) == 4
    assert all(0 <= s < e <= sp.time + 1e-9 and w > 0 for r in doc["power_floors"] for s, e, w in r)
    # A looser deadline can only help.
    slow = plan_for_swing(swing_frontier, swing_problem, BOUNDS, 1.2 * t0, local=False)
    fast = plan_for_swing(swing_frontier, swing_problem, BOUNDS, t0, local=False)
    assert slow.energy <= fast.energy + 1e-9


def test_swing_error_names_the_least_swing(
    swing_problem: EnergyProblem, swing_frontier: Frontier
) -> None:
    t0 = swing_frontier.max_frequency_time
    with pytest.raises(SwingError, match="least swing reachable is") as err:
        plan_for_swing(swing_frontier, swing_problem, SwingBounds(0.05, None), t0, max_floor=120.0)
    assert err.value.least_swing is not None
    assert 0.05 < err.value.least_swing < swing_of(swing_problem, swing_frontier.plans[0])


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
