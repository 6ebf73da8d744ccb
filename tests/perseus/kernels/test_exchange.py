"""The exchange kernel (``perseus.kernels.exchange``), through the rounder's wrapper.

An exchange speeds one node up to slow another where reclaiming slack alone cannot.
"""

from __future__ import annotations

import numpy as np
import pytest
from solver_instances import knapsack_problem

from perseus.solver import (
    Relaxation,
    Rounder,
    solve_problem,
)


def test_exchange_swaps_which_node_is_slowed() -> None:
    """An exchange finds the plan that slows another node, where reclaiming cannot.

    From the 0.1937 s plan (stage 1's forward slowed) with 4.1 ms to spare, slowing stage 0's
    backward needs 4.2 ms: reclaiming cannot, an exchange (speed the forward back up) can.
    """
    problem = knapsack_problem()
    rounder = Rounder(problem, Relaxation.build(problem))
    fr = solve_problem(problem)
    start = fr.plans[1][None, :]
    assert problem.evaluate(start[0]).time == pytest.approx(0.1937)
    deadline = np.array([0.1978])
    assert np.array_equal(rounder.reclaim(start, deadline), start)
    swapped = problem.evaluate(rounder.exchange(start, deadline)[0])
    assert swapped.time == pytest.approx(0.1969)
    assert swapped.energy == pytest.approx(16.0)
