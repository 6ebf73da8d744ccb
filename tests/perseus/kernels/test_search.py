"""The search kernels (``perseus.kernels.search``): the large-neighbourhood search and its repair.

The search reaches the plan only an exchange reaches, from any seed; the repair makes the
cheapest speed-up per second that the deadline needs.
"""

from __future__ import annotations

import numpy as np
import pytest
from solver_instances import knapsack_problem

from perseus.kernels import repair
from perseus.problem import EnergyProblem
from perseus.profiles import parse_profile_csv
from perseus.schedules import make_schedule
from perseus.solver import (
    Relaxation,
    Rounder,
    solve_problem,
)


def test_search_finds_the_plan_only_an_exchange_reaches() -> None:
    """The large-neighbourhood search gets there too, from any seed.

    One of its trials slows stage 0's backward and repairs the overrun by speeding the forward
    back up.
    """
    problem = knapsack_problem()
    rounder = Rounder(problem, Relaxation.build(problem))
    start = solve_problem(problem).plans[1][None, :]
    for seed in range(4):
        found = problem.evaluate(rounder.search(start, np.array([0.1978]), np.array([seed]), 50)[0])
        assert found.time == pytest.approx(0.1969)
        assert found.energy == pytest.approx(16.0)


#: A chain of two instructions: the forward's middle option is a cheap step from its slowest
#: but leaves a costly one to its fastest; the backward has just two options.
CHAIN_CSV = """stage,instruction,frequency,time,energy
0,forward,1000,1.0,10.0
0,forward,900,1.9,5.05
0,forward,800,2.0,5.0
0,backward,1000,1.0,7.0
0,backward,800,2.0,5.0
"""


def test_repair_makes_the_cheapest_speed_up_per_second_that_it_needs() -> None:
    """Both slowest (4 s) overrun a 3 s deadline by 1 s.

    The forward's next faster option costs least per second (0.5 J/s) but covers 0.1 s; taking
    the forward all the way to 1.0 s would cost 5 J/s. The repair takes the cheap step and then
    speeds the backward up (2 J/s): 12.05 J, where taking the forward to its fastest costs 15 J.
    """
    problem = EnergyProblem.build(parse_profile_csv(CHAIN_CSV), make_schedule("gpipe", 1, 1), 0.0)
    rounder = Rounder(problem, Relaxation.build(problem))
    pick = rounder.nopt - 1  # positions in each node's options by time: the slowest
    cur = rounder.times[np.arange(2), pick]
    fits = repair(
        rounder.dag, rounder.times, rounder.costs, 3.0, np.zeros(2, bool), pick, cur, np.empty(2)
    )
    assert fits
    plan = problem.evaluate(rounder.order[np.arange(2), pick])
    assert plan.time == pytest.approx(2.9)
    assert plan.energy == pytest.approx(12.05)
