"""The power tests' shared instances, each solved once a session.

``problem`` / ``frontier``: a 4-stage, 4-microbatch 1F1B pipeline cut from the A100 profile, for
plan power (``test_plan_power``), the cluster allocation (``test_cluster``) and the uniform
baselines (``test_uniform``). ``swing_problem`` / ``swing_frontier``: stages 0, 2, 5 and 7 over 6
microbatches, for the floors (``test_floors_least``) and swing-bounded plans (``test_swing``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus.schedules import one_f_one_b
from perseus.solver import solve_problem

#: Blocking power (W) measured with the A100 profile.
BLOCKING = 83.64
#: The six clocks (MHz) the instances keep.
CLOCKS = {1410, 1305, 1200, 1095, 990, 855}


@pytest.fixture(scope="session")
def problem(slice_profile: Callable[..., Profile]) -> EnergyProblem:
    prof = slice_profile([0, 1, 2, 3], CLOCKS)
    return EnergyProblem.build(prof, one_f_one_b(4, 4), BLOCKING)


@pytest.fixture(scope="session")
def frontier(problem: EnergyProblem) -> Frontier:
    return solve_problem(problem)


@pytest.fixture(scope="session")
def swing_problem(slice_profile: Callable[..., Profile]) -> EnergyProblem:
    prof = slice_profile([0, 2, 5, 7], CLOCKS)
    return EnergyProblem.build(prof, one_f_one_b(4, 6), BLOCKING)


@pytest.fixture(scope="session")
def swing_frontier(swing_problem: EnergyProblem) -> Frontier:
    return solve_problem(swing_problem)
