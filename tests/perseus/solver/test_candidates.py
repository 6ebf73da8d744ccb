"""The solve's pool of plans found (``perseus.solver.candidates``).

``pareto`` against the definition on random points; the pool keeping each plan once with its
true time and energy, spreading batches over its threads and polling the cancel; a snapshot's
Pareto set, intervals and gaps against the relaxed bound, and the worst of them chosen.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from perseus.errors import SolverCancelled
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import Relaxation, RelaxedFrontier
from perseus.solver.candidates import CandidatePool, pareto

P_A100 = 83.64


@pytest.fixture(scope="module")
def problem(slice_profile) -> EnergyProblem:
    return EnergyProblem.build(slice_profile([0, 1], {1410, 1200, 1020}), one_f_one_b(2, 2), P_A100)


@pytest.fixture(scope="module")
def every_plan(problem: EnergyProblem) -> np.ndarray:
    """Every plan of the 8-node, 3-clock instance (6,561)."""
    ranges = [range(int(k)) for k in problem.num_options]
    return np.array(list(itertools.product(*ranges)), dtype=np.uint8)


@pytest.fixture(scope="module")
def relaxed(problem: EnergyProblem) -> RelaxedFrontier:
    return RelaxedFrontier.sweep(problem, Relaxation.build(problem), memory=1 << 20)


@pytest.mark.parametrize("seed", range(8))
def test_pareto_keeps_exactly_the_undominated_points(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    times = rng.integers(0, 12, n).astype(float)  # ties in time on purpose
    waiting = rng.integers(-20, 20, n).astype(float)
    keep = pareto(times, waiting)
    assert np.all(np.diff(times[keep]) > 0) and np.all(np.diff(waiting[keep]) < 0)
    kept = {(times[k], waiting[k]) for k in keep}
    assert len(kept) == len(keep)  # of equal points, one is kept
    for i in range(n):
        t, w = times[i], waiting[i]
        beaten = np.any((times <= t) & (waiting <= w) & ((times < t) | (waiting < w)))
        assert ((t, w) in kept) == (not beaten), (i, t, w)


def test_the_pool_keeps_each_plan_once_with_its_true_time_and_energy(
    problem: EnergyProblem, every_plan: np.ndarray, relaxed: RelaxedFrontier
) -> None:
    with CandidatePool(problem, relaxed, threads=3) as pool:
        pool.add(every_plan[:100])
        pool.add(every_plan[50:150])  # 50 seen before
        snap = pool.snapshot()
    assert len(snap.plans) == 150
    assert np.array_equal(np.unique(snap.plans, axis=0), np.unique(every_plan[:150], axis=0))
    t, e = problem.evaluate_many(snap.plans)
    assert np.array_equal(snap.times, t) and np.array_equal(snap.energies, e)


def test_batches_run_over_the_threads_and_every_plan_is_added(
    problem: EnergyProblem, every_plan: np.ndarray, relaxed: RelaxedFrontier
) -> None:
    calls: list[int] = []

    def identity(plans: np.ndarray) -> np.ndarray:
        calls.append(len(plans))
        return plans

    with CandidatePool(problem, relaxed, threads=4) as pool:
        assert pool.threads == 4
        pool.batched(identity, every_plan)
        assert sorted(calls) == sorted(len(p) for p in np.array_split(every_plan, 4))
        assert pool.map(len, [every_plan[:3], every_plan[:5]]) == [3, 5]
        assert len(pool.snapshot().plans) == len(every_plan)
    with CandidatePool(problem, None) as pool, pytest.raises(RuntimeError, match="no relaxed"):
        pool.snapshot()


def test_a_cancel_is_polled_before_every_batch(
    problem: EnergyProblem, every_plan: np.ndarray, relaxed: RelaxedFrontier
) -> None:
    asked: list[int] = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) > 1

    with CandidatePool(problem, relaxed, cancel=cancel, threads=2) as pool:
        pool.batched(lambda plans: plans, every_plan[:10])
        with pytest.raises(SolverCancelled):
            pool.batched(lambda plans: plans, every_plan[10:20])
        assert len(pool.snapshot().plans) == 10  # the cancelled batch added nothing


def test_a_snapshot_is_the_pareto_set_with_its_intervals_and_gaps(
    problem: EnergyProblem, every_plan: np.ndarray, relaxed: RelaxedFrontier
) -> None:
    with CandidatePool(problem, relaxed, threads=2) as pool:
        pool.add(every_plan)
        snap = pool.snapshot()
    pr = relaxed.ranks_power
    waiting = snap.energies - pr * snap.times
    assert np.array_equal(snap.keep, pareto(snap.times, waiting))
    assert np.array_equal(snap.kept_times, snap.times[snap.keep])
    assert np.array_equal(snap.ends[: len(snap.keep) - 1], snap.kept_times[1:])  # the next plan's
    assert np.all(snap.ends > snap.kept_times[: len(snap.ends)])
    # every plan found, waiting to an interval's end, costs at least the relaxed bound there
    reached = snap.kept_waiting[: len(snap.ends)] + pr * snap.ends
    assert np.all(reached >= relaxed.bound(snap.ends) * (1 - 1e-9))
    np.testing.assert_allclose(snap.peak, reached / relaxed.bound(snap.ends) - 1, rtol=1e-12)
    # the worst intervals: the highest peaks, above the threshold only, highest first
    worst = snap.worst(3, above=0.0)
    assert len(worst) <= 3 and np.all(snap.peak[worst] > 0)
    assert list(snap.peak[worst]) == sorted(snap.peak[worst], reverse=True)
    assert snap.peak[worst[0]] == snap.peak.max()
    assert len(snap.worst(3, above=float(snap.peak.max()))) == 0
    np.testing.assert_allclose(snap.middles(worst), (snap.kept_times[worst] + snap.ends[worst]) / 2)
    assert np.array_equal(snap.kept_plans(worst), snap.plans[snap.keep[worst]])
