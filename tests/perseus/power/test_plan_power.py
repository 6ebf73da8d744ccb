"""The power of plans and the per-job budget query (``perseus.power.plan_power``).

Plan power against the evaluator, the fastest plan within a budget against brute force over the
frontier, bad budgets and shapes, and the relaxed bound's certified fastest time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from perseus.errors import InfeasibleError
from perseus.power import (
    PowerBudgetError,
    PowerJob,
    allocate_power,
    bound_time_for_power,
    deployment_power,
    index_for_power_budget,
    lowest_power,
    peak_power,
    peak_powers,
    plan_for_power_budget,
    point_powers,
    power_at,
    uniform_power_limit,
)
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b

BLOCKING = 83.64
BAD_BUDGETS = [-1.0, 0.0, math.nan, math.inf, -math.inf, "lots"]


# --- the power of plans ----------------------------------------------------------------------


def test_point_power_is_e_over_t_of_the_reevaluated_plan(frontier, problem) -> None:
    assert len(frontier) > 3
    t, e = problem.evaluate_many(frontier.plans)
    np.testing.assert_allclose(point_powers(frontier), e / t, rtol=1e-9)
    # P pipelines of d-wide ranks: P * d copies of the pipeline's energy over the same time
    np.testing.assert_allclose(
        point_powers(frontier, pipelines=3, tensor_parallel=2), 6 * e / t, rtol=1e-9
    )


def test_points_power_falls_strictly_along_the_frontier(frontier) -> None:
    assert np.all(np.diff(point_powers(frontier)) < 0)
    assert lowest_power(frontier) == pytest.approx(frontier.energies[-1] / frontier.times[-1])
    assert lowest_power(frontier, wait=True, pipelines=2) == pytest.approx(2 * 4 * BLOCKING)


def test_power_at_a_deadline_counts_the_waiting(frontier) -> None:
    i = len(frontier) // 2
    d = frontier.times[i] * 1.01
    assert power_at(frontier, d, tensor_parallel=4) == pytest.approx(
        4 * frontier.energy_at(d) / d, rel=1e-12
    )
    # at a point's own time the least energy is at most that point's
    assert power_at(frontier, float(frontier.times[i])) <= point_powers(frontier)[i] * (1 + 1e-12)


def test_peak_power_is_the_hottest_instruction_of_the_plan(frontier, problem) -> None:
    peaks = peak_powers(frontier, problem)
    for i in (0, len(frontier) // 2, len(frontier) - 1):
        plan = frontier.plans[i]
        brute = max(
            problem.energies[n, plan[n]] / problem.times[n, plan[n]]
            for n in range(problem.num_nodes)
        )
        assert peak_power(problem, plan) == pytest.approx(brute, rel=1e-12)
        assert peaks[i] == pytest.approx(brute, rel=1e-12)
        # per GPU, the average never exceeds the peak (waiting draws less than computing)
        assert frontier.energies[i] / (frontier.times[i] * 4) <= peaks[i]
    other = EnergyProblem.build(problem.profile, one_f_one_b(4, 2), BLOCKING)
    with pytest.raises(ValueError, match="instructions"):
        peak_powers(frontier, other)


def test_deployment_power_with_a_straggler(frontier) -> None:
    f, last = frontier, len(frontier) - 1
    t, e, w = deployment_power([(f, 0), (f, 0)], tensor_parallel=2)
    assert t == f.times[0] and e == pytest.approx(4 * f.energies[0]) and w == pytest.approx(e / t)
    # pipeline 1 is slow: pipeline 0 waits for it at blocking power
    t, e, w = deployment_power([(f, 0), (f, last)])
    assert t == f.times[last]
    wait = BLOCKING * 4 * (f.times[last] - f.times[0])
    assert e == pytest.approx(f.energies[0] + wait + f.energies[last])
    t2, _, w2 = deployment_power([(f, last)], deadline=2 * float(f.times[last]))
    assert t2 == 2 * f.times[last] and w2 < point_powers(f)[last]
    with pytest.raises(IndexError):
        deployment_power([(f, len(f))])


# --- one job under a budget ------------------------------------------------------------------


def test_the_fastest_plan_within_a_budget_matches_brute_force(frontier) -> None:
    powers = point_powers(frontier, pipelines=2)
    for w in np.linspace(powers.min(), 1.05 * powers.max(), 41):
        got = plan_for_power_budget(frontier, float(w), pipelines=2)
        ok = [i for i in range(len(frontier)) if powers[i] <= w * (1 + 1e-12)]
        best = min(ok, key=lambda i: (frontier.times[i], frontier.energies[i]))
        assert got.index == best
        assert got.average_power <= w * (1 + 1e-12)
        assert got.time == frontier.times[best] == got.plan_time
        assert got.energy == pytest.approx(2 * frontier.energies[best])
        assert got.slowdown == pytest.approx(frontier.times[best] / frontier.max_frequency_time - 1)
        assert index_for_power_budget(frontier, float(w), pipelines=2) == best


def test_waiting_reaches_the_least_deadline_whose_power_fits(frontier) -> None:
    powers = point_powers(frontier)
    for w in np.linspace(0.5 * powers.min() + 0.5 * 4 * BLOCKING, powers.max(), 23):
        got = plan_for_power_budget(frontier, float(w), wait=True)
        assert got.average_power <= w * (1 + 1e-9)
        assert got.time >= got.plan_time
        assert power_at(frontier, got.time) <= w * (1 + 1e-9)
        # any earlier deadline draws more than the budget
        for d in np.linspace(frontier.times[0], got.time, 50)[:-1]:
            if d < got.time * (1 - 1e-9):
                assert power_at(frontier, float(d)) > w
        if w >= powers.min():
            assert got.time <= plan_for_power_budget(frontier, float(w)).time


def test_a_budget_below_the_lowest_power_names_it(frontier) -> None:
    low = lowest_power(frontier, pipelines=2, tensor_parallel=2)
    with pytest.raises(PowerBudgetError, match="lowest achievable") as err:
        plan_for_power_budget(frontier, 0.99 * low, pipelines=2, tensor_parallel=2)
    assert err.value.lowest_power == pytest.approx(low)
    assert f"{low:.6g} W" in str(err.value)
    assert isinstance(err.value, InfeasibleError) and isinstance(err.value, ValueError)
    # waiting lowers the floor to the blocking power of every GPU, never below
    plan_for_power_budget(frontier, 0.99 * low, pipelines=2, tensor_parallel=2, wait=True)
    with pytest.raises(PowerBudgetError, match="blocking power") as err:
        plan_for_power_budget(frontier, 4 * 4 * BLOCKING, pipelines=2, tensor_parallel=2, wait=True)
    assert err.value.lowest_power == pytest.approx(16 * BLOCKING)


@pytest.mark.parametrize("bad", BAD_BUDGETS)
def test_bad_budgets_are_clear_errors(frontier, problem, bad) -> None:
    with pytest.raises(PowerBudgetError, match="power budget must be"):
        plan_for_power_budget(frontier, bad)  # type: ignore[arg-type]
    with pytest.raises(PowerBudgetError, match="power budget must be"):
        uniform_power_limit(problem, bad)  # type: ignore[arg-type]
    with pytest.raises(PowerBudgetError, match="power budget must be"):
        allocate_power([PowerJob.from_frontier("a", frontier)], bad)  # type: ignore[arg-type]


def test_bad_job_shapes_are_rejected(frontier) -> None:
    for kw in ({"pipelines": 0}, {"tensor_parallel": -1}, {"pipelines": 1.5}):
        with pytest.raises(ValueError, match="integer >= 1"):
            point_powers(frontier, **kw)  # type: ignore[arg-type]


def test_the_relaxed_bound_certifies_the_fastest_time(frontier) -> None:
    powers = point_powers(frontier)
    t0 = frontier.max_frequency_time
    for w in np.linspace(powers.min(), 1.1 * powers.max(), 31):
        tb = bound_time_for_power(frontier, float(w))
        got = plan_for_power_budget(frontier, float(w), wait=True)
        assert tb <= got.time * (1 + 1e-9)
        assert frontier.lower_bound_at(tb) <= w * tb * (1 + 1e-9)
        if tb > frontier.bound_times[0] * (1 + 1e-9):  # the least such T: equality there
            assert frontier.lower_bound_at(tb) == pytest.approx(w * tb, rel=1e-9)
        assert tb >= frontier.bound_times[0] * (1 - 1e-12) and tb <= t0 * 2
    assert bound_time_for_power(frontier, 4 * BLOCKING) == math.inf
