"""The uniform baselines (``perseus.power.uniform``).

One power limit or one locked clock for every instruction, against their definitions and against
Perseus's plan at the same budget.
"""

from __future__ import annotations

import numpy as np
import pytest

from perseus.frontier import Frontier
from perseus.power import (
    PowerBudgetError,
    clock_lock_plan,
    plan_for_power_budget,
    power_limit_plan,
    uniform_clock_lock,
    uniform_power_limit,
)

BLOCKING = 83.64


def p0(f: Frontier) -> float:
    return f.max_frequency_energy / f.max_frequency_time


def test_a_power_limit_runs_each_instruction_at_its_highest_clock_within_it(problem) -> None:
    power = problem.energies / problem.times
    limit = float(np.median(power))
    plan = power_limit_plan(problem, limit)
    for n in range(problem.num_nodes):
        within = [k for k in range(problem.num_options[n]) if power[n, k] <= limit]
        assert plan[n] == (within[0] if within else problem.num_options[n] - 1)


def test_the_uniform_limit_is_the_highest_that_meets_the_budget(problem, frontier) -> None:
    w = 0.85 * p0(frontier)
    u = uniform_power_limit(problem, w)
    assert u.average_power <= w
    r = problem.evaluate(u.plan)
    assert (r.time, r.energy) == (u.time, u.energy)
    powers = np.unique(problem.energies / problem.times)
    higher = powers[powers > u.setting]
    if higher.size:  # the next limit up breaks the budget
        nxt = problem.evaluate(power_limit_plan(problem, float(higher[0])))
        assert nxt.energy / nxt.time > w
    # Perseus is at least as fast at the same budget, pacing included, up to the solver's gap
    assert plan_for_power_budget(frontier, w, wait=True).time <= u.time * (1 + 1e-3)
    with pytest.raises(PowerBudgetError, match="no uniform power limit"):
        uniform_power_limit(problem, 4 * BLOCKING)


def test_the_clock_lock_is_the_highest_clock_that_meets_the_budget(problem, frontier) -> None:
    w = 0.8 * p0(frontier)
    u = uniform_clock_lock(problem, w)
    assert u.average_power <= w
    assert set(problem.frequencies_of(u.plan)) == {int(u.setting)}
    for f in sorted({int(x) for x in problem.freqs.ravel()}):
        if f > u.setting:
            r = problem.evaluate(clock_lock_plan(problem, f))
            assert r.energy / r.time > w
    assert uniform_clock_lock(problem, 10 * p0(frontier)).setting == problem.freqs.max()
    with pytest.raises(PowerBudgetError, match="no uniform clock"):
        uniform_clock_lock(problem, 4 * BLOCKING)
