"""One budget over several jobs (``perseus.power.cluster``).

The allocation against brute force over every combination of the jobs' frontier points, for
throughput and for fairness; real frontiers, stragglers and bad input.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from perseus.power import (
    PowerBudgetError,
    PowerJob,
    allocate_power,
    plan_for_power_budget,
    point_powers,
)


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
