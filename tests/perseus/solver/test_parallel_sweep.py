"""The relaxed sweep over deadline ranges in worker processes (:mod:`perseus.solver.parallel`).

The merged bound equals the one-core sweep's (never above it, below by at most a relative 1e-9) on
1F1B, interleaved and thinned smooth hulls, with 2 and 3 workers; equals the independent LP; a
refused range start falls back to a sweep from the longest durations; a whole solve with workers;
``SolverOptions.workers``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from lp_reference import LPRelaxation

import perseus.solver.parallel as parallel
import perseus.solver.stages as stages
from perseus.errors import OptionError
from perseus.problem import EnergyProblem
from perseus.profiles import InstructionProfile, Profile
from perseus.schedules import interleaved_1f1b, one_f_one_b
from perseus.solver import SolverOptions, solve_problem
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.relaxation import Relaxation
from perseus.solver.solve import SolveStats

P_A100 = 83.64


def tiled(a100: Profile, stages: int) -> Profile:
    return Profile({(s, k): a100[(s % a100.stages, k)] for s in range(stages) for k in a100.kinds})


def smooth(stages: int, clocks: int = 32) -> Profile:
    f = 1980 - 15 * np.arange(clocks)
    x = f / 1980
    out = {}
    for s in range(stages):
        for kind, mult in (("forward", 1.0), ("backward", 2.0)):
            t = mult * (1 + 0.02 * s) * (0.008 + 0.040 / x)
            out[(s, kind)] = InstructionProfile(f.astype(np.int64), t, (90 + 310 * x**3) * t)
    return Profile(out)


def assert_same_bound(problem: EnergyProblem, par: RelaxedFrontier, ref: RelaxedFrontier) -> None:
    for times in (ref.times, par.times):
        b_par, b_ref = par.bound(times), ref.bound(times)
        assert np.all(b_par <= b_ref * (1 + 1e-12))  # never above the exact sweep
        np.testing.assert_allclose(b_par, b_ref, rtol=1e-9)
    assert par.t_min == ref.t_min and par.t_max == ref.t_max
    # durations kept across the ranges, each within its own deadline
    assert len(par.kept_times) > 2 and np.all(np.diff(par.kept_times) >= 0)
    for t, d in zip(par.kept_times[::7], par.kept_durations[::7], strict=True):
        assert problem.dag.iteration_time(d) <= t * (1 + 1e-9)


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("shape", ["1f1b", "interleaved", "smooth"])
def test_ranges_merge_into_the_one_core_bound(a100: Profile, shape: str, workers: int) -> None:
    if shape == "1f1b":
        problem = EnergyProblem.build(tiled(a100, 16), one_f_one_b(16, 24), P_A100)
    elif shape == "interleaved":
        problem = EnergyProblem.build(tiled(a100, 8), interleaved_1f1b(8, 16, 2), P_A100)
    else:
        problem = EnergyProblem.build(smooth(8), one_f_one_b(8, 16), 80.0)
    rel = Relaxation.build(problem)
    hulls = rel.under_estimate(np.full(problem.num_nodes, 1.0), 0.0) if shape == "smooth" else None
    ref = RelaxedFrontier.sweep(problem, rel, memory=2**26, hulls=hulls)
    ranges: list[parallel.RangeStats] = []
    par = parallel.parallel_sweep(
        problem, rel, workers=workers, memory=2**26, hulls=hulls, stats=ranges
    )
    assert len(ranges) == workers and all(r.breakpoints > 0 for r in ranges)
    assert ranges[0].margin == 0.0 and all(r.margin > 0 for r in ranges[1:])
    assert sum(r.breakpoints for r in ranges) == len(par.times)
    assert_same_bound(problem, par, ref)


def test_the_merged_bound_is_the_lp(a100: Profile) -> None:
    problem = EnergyProblem.build(tiled(a100, 4), one_f_one_b(4, 6), P_A100)
    rel = Relaxation.build(problem)
    par = parallel.parallel_sweep(problem, rel, workers=2, memory=2**26)
    lp = LPRelaxation(problem)
    pr = P_A100 * problem.dag.num_ranks
    for u in (0.0, 0.1, 0.3, 0.7):
        t = par.t_min + u * (par.t_max - par.t_min) + 1e-9
        assert par.bound(np.array([t]))[0] == pytest.approx(lp.solve(t).value, rel=1e-7)
        assert par.bound(np.array([t]))[0] >= pr * t  # sanity: a bound with the idle power


def test_a_refused_start_sweeps_from_the_longest_durations(
    a100: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = EnergyProblem.build(tiled(a100, 8), one_f_one_b(8, 12), P_A100)
    rel = Relaxation.build(problem)
    ref = RelaxedFrontier.sweep(problem, rel, memory=2**26)
    monkeypatch.setattr(parallel, "START_TOLERANCE", -1.0)  # no start is good enough
    par = parallel.parallel_sweep(problem, rel, workers=2, memory=2**26)
    np.testing.assert_array_equal(par.times, ref.times)
    np.testing.assert_array_equal(par.costs, ref.costs)


def test_a_whole_solve_with_workers(a100: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = EnergyProblem.build(tiled(a100, 8), one_f_one_b(8, 12), P_A100)
    monkeypatch.setattr(stages, "PARALLEL_MIN_NODES", 0)
    stats = SolveStats()
    two = solve_problem(problem, SolverOptions(workers=2), stats=stats)
    one = solve_problem(problem, SolverOptions(workers=1))
    assert len(stats.ranges) == 2
    t, e = problem.evaluate_many(two.plans)
    np.testing.assert_allclose((two.times, two.energies), (t, e), rtol=1e-12)
    assert np.all(two.lower_bounds <= two.energies * (1 + 1e-12))
    for deadline in (1.0, 1.05, 1.2):
        d = deadline * one.max_frequency_time
        assert two.lower_bound_at(d) == pytest.approx(one.lower_bound_at(d), rel=1e-9)
        assert two.energy_at(d) <= one.energy_at(d) * 1.002  # plans as good, to noise


def test_workers_option() -> None:
    assert SolverOptions().workers is None
    assert SolverOptions().cores == len(os.sched_getaffinity(0))
    assert SolverOptions(workers=3).cores == 3
    for bad in (0, -1, 1.5, True):
        with pytest.raises(OptionError) as err:
            SolverOptions(workers=bad)  # type: ignore[arg-type]
        assert err.value.field == "workers"
