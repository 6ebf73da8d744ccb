"""The solve's stages (``perseus.solver.stages``), each run on its own.

``relax`` reports progress up to 0.6 and gives the same bound by either core; the diagonal
rounding thresholds follow each microbatch through the stages; ``seed_candidates`` rounds the
relaxed breakpoints into the pool; a window hides the intervals outside it; ``refine`` never
loses a plan; ``assemble`` builds the frontier of the Pareto plans with their bounds. The whole
solve is ``test_solve*.py``'s.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import Relaxation, Rounder, SolverOptions
from perseus.solver.candidates import CandidatePool
from perseus.solver.stages import (
    Run,
    assemble,
    diagonal_up_at,
    refine,
    relax,
    seed_candidates,
)

P_A100 = 83.64


@pytest.fixture(scope="module")
def problem(slice_profile) -> EnergyProblem:
    prof = slice_profile([0, 1, 2], {1410, 1305, 1200, 1095, 990, 855})
    return EnergyProblem.build(prof, one_f_one_b(3, 4), P_A100)


def make_run(problem: EnergyProblem, options: SolverOptions) -> tuple[Run, list[float]]:
    rel = Relaxation.build(problem)
    seen: list[float] = []
    relaxed = relax(problem, relaxation=rel, progress=seen.append)
    pool = CandidatePool(problem, relaxed, threads=2)
    rounder = Rounder(problem, rel)
    rng = np.random.default_rng(options.seed)
    return Run(problem, relaxed, rounder, pool, options, rng, seen.append), seen


def test_relax_reports_up_to_six_tenths_and_both_cores_bound_alike(problem) -> None:
    seen: list[float] = []
    sweep = relax(problem, progress=seen.append)
    assert seen and max(seen) == pytest.approx(0.6) and min(seen) >= 0.0
    sandwich = relax(problem, core="sandwich", tolerance=1e-3)
    assert sandwich.t_min == pytest.approx(sweep.t_min)
    grid = np.linspace(sweep.t_min, sweep.t_max, 50)
    exact, tangents = sweep.bound(grid), sandwich.bound(grid)
    assert np.all(tangents <= exact * (1 + 1e-9))  # below the exact bound, within tolerance
    assert np.all(tangents >= exact * (1 - 1e-3) - 1e-9)


def test_diagonal_thresholds_follow_each_microbatch_through_the_stages(problem) -> None:
    offsets = np.array([0.0, 0.25])
    up = diagonal_up_at(problem, offsets)
    dag = problem.dag
    assert up.shape == (2, problem.num_nodes) and np.all((up >= 0) & (up < 1))
    for m in range(dag.schedule.microbatches):
        for kind in (0, 1):
            mine = up[0, (dag.microbatch == m) & (dag.kind == kind)]
            assert np.all(mine == mine[0])  # one threshold for the pass through every stage
    fwd = up[0, (dag.kind == 0) & (dag.stage == 0)][
        np.argsort(dag.microbatch[(dag.kind == 0) & (dag.stage == 0)])
    ]
    bwd = up[0, (dag.kind == 1) & (dag.stage == 0)][
        np.argsort(dag.microbatch[(dag.kind == 1) & (dag.stage == 0)])
    ]
    np.testing.assert_allclose((bwd - fwd) % 1.0, 0.5)  # each kind half a turn apart
    golden = (np.sqrt(5.0) - 1) / 2
    np.testing.assert_allclose(np.diff(fwd) % 1.0, golden % 1.0)
    np.testing.assert_allclose((up[1] - up[0]) % 1.0, 0.25)


def test_seeding_rounds_the_breakpoints_into_the_pool(problem) -> None:
    run, _ = make_run(problem, SolverOptions(initial_candidates=5))
    with run.pool:
        seed_candidates(run)
        snap = run.pool.snapshot()
    assert 2 <= len(snap.plans) <= 5 + 1  # the max-frequency plan, and at most 5 rounded
    assert any(np.array_equal(p, problem.max_frequency_plan()) for p in snap.plans)
    assert np.all(snap.times <= run.relaxed.t_max * (1 + 1e-9))
    assert np.all(snap.energies >= run.relaxed.bound(snap.times) * (1 - 1e-9))


def test_a_window_hides_the_intervals_outside_it(problem) -> None:
    whole, _ = make_run(problem, SolverOptions(initial_candidates=16))
    with whole.pool:
        seed_candidates(whole)
        snap = whole.snapshot()
        mid = snap.middles(np.arange(len(snap.ends)))
        lo, hi = float(np.median(mid)), float(mid.max())
        windowed = replace(whole, window=(lo, hi))
        inside = windowed.snapshot().peak
    assert np.all(np.isneginf(inside[mid < lo]))
    np.testing.assert_array_equal(inside[mid >= lo], snap.peak[mid >= lo])


def test_refine_keeps_every_plan_and_assemble_builds_the_frontier(problem) -> None:
    run, seen = make_run(problem, SolverOptions(initial_candidates=4, hard_gap=0.0))
    with run.pool:
        seed_candidates(run)
        before = run.pool.snapshot()
        refine(run)
        after = run.pool.snapshot()
        fr = assemble(problem, run.relaxed, after, progress=seen.append)
    assert len(after.plans) > len(before.plans)  # the splits and randomised roundings found more
    kept = {p.tobytes() for p in after.plans}
    assert all(p.tobytes() in kept for p in before.plans)
    assert seen[-1] == 1.0
    assert np.array_equal(fr.plans, after.plans[after.keep])
    t, e = problem.evaluate_many(fr.plans)
    assert np.array_equal(fr.times, t) and np.array_equal(fr.energies, e)
    assert np.all(np.diff(fr.times) > 0)
    assert np.all(fr.lower_bounds <= fr.energies)
    fastest = problem.evaluate(problem.max_frequency_plan())
    assert (fr.max_frequency_time, fr.max_frequency_energy) == (fastest.time, fastest.energy)
