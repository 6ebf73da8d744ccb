"""Rounding and reclaiming (``perseus.kernels.rounding``), through the rounder's wrapper.

On the knapsack chain (stage 1's forward saves 2.0 J for 1 ms, stage 0's backward 6.2 J for
4.2 ms): relaxed durations at a breakpoint round to that breakpoint's plan, and reclaiming gives
a plan's slack to the steepest saving per second first, slowing only what fits. The property test
over random instances is ``tests/perseus/solver/test_rounder.py``'s.
"""

from __future__ import annotations

import numpy as np
import pytest
from solver_instances import knapsack_problem

from perseus.solver import Relaxation, Rounder, relaxed_frontier


def test_durations_at_a_breakpoint_round_to_its_plan() -> None:
    problem = knapsack_problem()
    rel = Relaxation.build(problem)
    steps = list(relaxed_frontier(problem, rel))
    assert sorted(round(s.time, 6) for s in steps) == [0.1927, 0.1937, 0.1979]
    durations = np.stack([s.durations for s in steps])
    deadlines = np.array([s.time for s in steps])
    rounder = Rounder(problem, rel)
    for jumps in (False, True):
        plans = rounder.round(durations, deadlines, np.full(len(steps), jumps))
        times, energies = problem.evaluate_many(plans)
        np.testing.assert_allclose(times, deadlines, rtol=1e-12)  # the vertices: exact
        np.testing.assert_allclose(energies, [s.cost for s in steps], rtol=1e-9)


@pytest.mark.parametrize(
    ("deadline", "time", "energy"),
    [
        (0.1930, 0.1927, 22.2),  # 0.3 ms of slack: nothing fits, nothing moves
        (0.1937, 0.1937, 20.2),  # 1 ms: the forward, the steepest saving (2,000 J/s)
        (0.1975, 0.1937, 20.2),  # the backward (1,476 J/s) needs 4.2 ms more: only 3.8 left
        (0.1979, 0.1979, 14.0),  # both
    ],
)
def test_reclaiming_gives_the_slack_to_the_steepest_saving_that_fits(
    deadline: float, time: float, energy: float
) -> None:
    problem = knapsack_problem()
    rounder = Rounder(problem, Relaxation.build(problem))
    fastest = problem.max_frequency_plan()[None, :]
    assert problem.evaluate(fastest[0]).time == pytest.approx(0.1927)
    plan = rounder.reclaim(fastest, np.array([deadline * (1 + 1e-12)]), exchange_passes=0)[0]
    got = problem.evaluate(plan)
    assert got.time == pytest.approx(time) and got.energy == pytest.approx(energy)
