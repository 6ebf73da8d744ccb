"""Power budgets (``perseus.power``).

Plan power against the evaluator, the per-job query against brute force over the frontier, the
cluster allocation against brute force over every combination, and the uniform baselines against
their definitions.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import perseus
from perseus.errors import InfeasibleError
from perseus.frontier import Frontier
from perseus.power import (
    PowerBudgetError,
    PowerJob,
    allocate_power,
    bound_time_for_power,
    clock_lock_plan,
    deployment_power,
    index_for_power_budget,
    lowest_power,
    peak_power,
    peak_powers,
    plan_for_power_budget,
    point_powers,
    power_at,
    power_limit_plan,
    uniform_clock_lock,
    uniform_power_limit,
)
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import solve_problem

BLOCKING = 83.64
BAD_BUDGETS = [-1.0, 0.0, math.nan, math.inf, -math.inf, "lots"]


@pytest.fixture(scope="module")
def problem(slice_profile) -> EnergyProblem:
    prof = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855})
    return EnergyProblem.build(prof, one_f_one_b(4, 4), BLOCKING)


@pytest.fixture(scope="module")
def frontier(problem: EnergyProblem) -> Frontier:
    return solve_problem(problem)


def p0(f: Frontier) -> float:
    return f.max_frequency_energy / f.max_frequency_time


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


# --- one budget over several jobs ------------------------------------------------------------


def random_job(rng: np.random.Generator, name: str, k: int) -> PowerJob:
    times = 1.0 + np.cumsum(rng.uniform(0.01, 0.2, k)) - 0.01
    powers = 1000 * np.cumsum(rng.uniform(0.01, 0.3, k))[::-1] + 200
    gpus = int(rng.integers(1, 64))
    return PowerJob(name, gpus, times, powers, np.arange(k, dtype=np.int64), float(times[0]))


def brute(jobs: list[PowerJob], w: float, policy: str) -> tuple[float, float]:
    """(least objective, its GPU-time lost) over every combination within ``w``."""
    best: tuple[float, float] | None = None
    for combo in itertools.product(*(range(len(j.times)) for j in jobs)):
        if math.fsum(j.powers[k] for j, k in zip(jobs, combo, strict=True)) > w:
            continue
        lost = math.fsum(j.gpus * j.slowdowns[k] for j, k in zip(jobs, combo, strict=True))
        worst = max(j.slowdowns[k] for j, k in zip(jobs, combo, strict=True))
        key = (lost, lost) if policy == "throughput" else (worst, lost)
        best = key if best is None or key < best else best
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("policy", ["throughput", "fair"])
def test_the_allocation_is_optimal_on_small_instances(seed: int, policy: str) -> None:
    rng = np.random.default_rng(seed)
    jobs = [
        random_job(rng, f"j{i}", int(rng.integers(1, 7))) for i in range(int(rng.integers(1, 5)))
    ]
    low = math.fsum(j.lowest_power for j in jobs)
    high = math.fsum(j.max_power for j in jobs)
    for w in np.linspace(low, high, 7):
        a = allocate_power(jobs, float(w), policy=policy)
        assert a.allocated_watts <= w  # exactly, never over
        assert [s.name for s in a.jobs] == [j.name for j in jobs]
        objective, lost = brute(jobs, float(w), policy)
        assert a.objective == pytest.approx(objective, abs=1e-9)
        if policy == "fair":
            assert a.max_slowdown == pytest.approx(objective, abs=1e-12)
            assert a.gpu_time_lost == pytest.approx(lost, abs=1e-9)  # then the least GPU-time lost
        else:
            assert a.gpu_time_lost == pytest.approx(objective, abs=1e-9)
        for s, j in zip(a.jobs, jobs, strict=True):
            k = int(np.flatnonzero(j.indices == s.index)[0])
            assert s.watts == j.powers[k] and s.time == j.times[k]


@pytest.mark.parametrize("policy", ["throughput", "fair"])
def test_the_allocation_of_real_frontiers_is_optimal(frontier, policy: str) -> None:
    f = frontier.thinned((frontier.times[-1] - frontier.times[0]) / 12)
    jobs = [
        PowerJob.from_frontier("a", f, pipelines=4),
        PowerJob.from_frontier("b", f, tensor_parallel=2),
        PowerJob.from_frontier("c", f, min_time=float(f.times[2]) * 1.0001),
    ]
    low = math.fsum(j.lowest_power for j in jobs)
    high = math.fsum(j.max_power for j in jobs)
    for w in np.linspace(low, high, 9)[1:]:
        a = allocate_power(jobs, float(w), policy=policy)
        assert a.allocated_watts <= w
        assert a.objective == pytest.approx(brute(jobs, float(w), policy)[0], abs=1e-9)


def test_fair_and_throughput_differ_where_they_should() -> None:
    # a big job and a small one, same curves: throughput slows the small one, fair both alike
    t = np.array([1.0, 1.1, 1.2])
    p = np.array([1000.0, 900.0, 800.0])
    big = PowerJob("big", 64, t, p, np.arange(3), 1.0)
    small = PowerJob("small", 8, t, p, np.arange(3), 1.0)
    thr = allocate_power([big, small], 1800.0)
    assert [s.index for s in thr.jobs] == [0, 2]
    fair = allocate_power([big, small], 1800.0, policy="fair")
    assert [s.index for s in fair.jobs] == [1, 1]
    assert fair.max_slowdown < thr.max_slowdown and thr.gpu_time_lost < fair.gpu_time_lost
    doc = thr.to_json()
    assert doc["watts"] == 1800.0 and doc["policy"] == "throughput" and doc["feasible"] is True
    assert doc["allocated_watts"] == 1800.0
    assert doc["jobs"][1] == {
        "id": "small",
        "watts": 800.0,
        "slowdown": pytest.approx(0.2),
        "point": 2,
    }


def test_one_job_gets_its_fastest_plan_within_the_budget(frontier) -> None:
    job = PowerJob.from_frontier("only", frontier, pipelines=2, tensor_parallel=2)
    assert job.gpus == 2 * 2 * 4
    powers = point_powers(frontier, pipelines=2, tensor_parallel=2)
    for w in np.linspace(powers.min(), powers.max(), 9):
        a = allocate_power([job], float(w))
        assert (
            a.jobs[0].index
            == plan_for_power_budget(frontier, float(w), pipelines=2, tensor_parallel=2).index
        )


def test_a_straggler_frees_power_for_the_others(frontier) -> None:
    slow_time = float(frontier.times[len(frontier) // 2]) * 1.001
    free = PowerJob.from_frontier("a", frontier)
    held = PowerJob.from_frontier("a", frontier, min_time=slow_time)
    assert held.times[0] == slow_time and held.reference_time == slow_time
    assert held.slowdowns[0] == 0.0 and len(held.times) < len(free.times)
    assert held.powers[0] == pytest.approx(frontier.energy_at(slow_time) / slow_time)
    assert held.indices[0] == frontier.index_for_deadline(slow_time, wait=True)
    other = PowerJob.from_frontier("b", frontier)
    w = 0.5 * (free.max_power + other.max_power) + 0.5 * (held.powers[0] + other.max_power) - 1
    before = allocate_power([free, other], w)
    after = allocate_power([held, other], w)
    assert after.jobs[1].slowdown <= before.jobs[1].slowdown


def test_allocation_errors() -> None:
    rng = np.random.default_rng(0)
    jobs = [random_job(rng, "a", 4), random_job(rng, "b", 3)]
    low = jobs[0].lowest_power + jobs[1].lowest_power
    with pytest.raises(PowerBudgetError, match="lowest achievable") as err:
        allocate_power(jobs, 0.999 * low)
    assert err.value.lowest_power == pytest.approx(low)
    with pytest.raises(ValueError, match="policy"):
        allocate_power(jobs, 2 * low, policy="random")
    with pytest.raises(ValueError, match="at least one job"):
        allocate_power([], 100.0)
    with pytest.raises(ValueError, match="distinct"):
        allocate_power([jobs[0], jobs[0]], 10 * low)
    a = allocate_power(jobs, low)  # exactly the lowest: every job at its slowest choice
    assert [s.index for s in a.jobs] == [3, 2]


# --- uniform baselines -----------------------------------------------------------------------


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


def test_the_public_api_exports_the_power_names() -> None:
    from perseus import power

    assert perseus.plan_for_power_budget is power.plan_for_power_budget
    assert perseus.allocate_power is power.allocate_power
    assert issubclass(perseus.PowerBudgetError, perseus.InfeasibleError)
