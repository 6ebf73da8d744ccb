"""The rounder (``perseus.solver.rounder``): relaxed durations to measured plans.

Rounding (nearest-vertex, randomised, by diagonals), reclaiming, exchanging and searching keep
every plan within its deadline and never raise its energy; the diagonals find each pass's nodes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from solver_instances import instances

from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus.schedules import Schedule, make_schedule, one_f_one_b
from perseus.solver import (
    Relaxation,
    Rounder,
    relaxed_frontier,
)

P_A100 = 83.64


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.integers(0, 2**32 - 1))
def test_rounding_reclaim_and_exchange_keep_every_plan_within_its_deadline(
    instance: tuple[Profile, Schedule, float], seed: int
) -> None:
    """Rounding, reclaiming, exchanging and searching keep every plan within its deadline.

    Rounded plans (nearest-vertex and randomised) meet the relaxed optimum's time and use only
    undominated measured options; giving a plan more slack, exchanging or searching never raises
    its energy at the deadline (waiting included) and keeps it within the deadline.
    """
    profile, schedule, power = instance
    problem = EnergyProblem.build(profile, schedule, power)
    rel = Relaxation.build(problem)
    steps = list(relaxed_frontier(problem, rel))
    durations = np.stack([step.durations for step in steps])
    deadlines = np.array([step.time for step in steps])
    rounder = Rounder(problem, rel)
    rng = np.random.default_rng(seed)
    nodes = np.arange(problem.num_nodes)
    pr = power * schedule.ranks
    for up_at in (None, rng.random(durations.shape)):
        plans = rounder.round(durations, deadlines, rng.random(len(steps)) < 0.5, up_at)
        times, energies = problem.evaluate_many(plans)
        assert np.all(times <= deadlines * (1 + 1e-9))
        assert np.all(rel.pareto[nodes, plans])
    later = times * (1 + 0.05 * rng.random(len(times)))
    before = energies + pr * (later - times)
    seeds = rng.integers(0, 2**31, len(plans))
    for better in (
        rounder.reclaim(plans, later),
        rounder.exchange(plans, later),
        rounder.search(plans, later, seeds, 20),
    ):
        t2, e2 = problem.evaluate_many(better)
        assert np.all(t2 <= later * (1 + 1e-9))
        assert np.all(e2 + pr * (later - t2) <= before + 1e-9 * np.abs(before))
        assert np.all(rel.pareto[nodes, better])


@pytest.mark.parametrize(
    "schedule",
    [one_f_one_b(4, 6), make_schedule("interleaved-1f1b", 2, 4, 2), make_schedule("gpipe", 3, 2)],
    ids=["1f1b", "interleaved", "gpipe"],
)
def test_diagonals_follow_each_pass_through_the_stages(slice_profile, schedule: Schedule) -> None:
    """The search's diagonal moves find the node of every (model stage, kind, microbatch).

    Each node exactly once, at its own op's place, and nothing else.
    """
    profile = slice_profile(list(range(schedule.ranks)), {1410, 1200, 990})
    problem = EnergyProblem.build(profile, schedule, P_A100)
    diag = Rounder(problem, Relaxation.build(problem)).diag
    dag = problem.dag
    assert sorted(diag[diag >= 0].tolist()) == list(range(problem.num_nodes))
    assert np.array_equal(diag[dag.stage, dag.kind, dag.microbatch], np.arange(problem.num_nodes))
    assert diag.shape == (schedule.stages, 2, schedule.microbatches)
