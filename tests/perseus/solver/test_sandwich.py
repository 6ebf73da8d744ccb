"""The sandwich relaxation core.

The network simplex kernel against networkx (cold and warm started), the sandwich's tangent-line
bound against the independent LP and the exact sweep, its durations within their deadlines, and a
whole solve with it.
"""

from __future__ import annotations

import numpy as np
import pytest
from lp_reference import LPRelaxation
from solver_instances import check_frontier

from perseus.errors import OptionError
from perseus.problem import EnergyProblem
from perseus.schedules import gpipe, interleaved_1f1b, one_f_one_b
from perseus.solver import Relaxation, SolverOptions, solve_problem
from perseus.solver.sandwich import SandwichStats, sandwich_frontier
from perseus.solver.stages import relax

P_A100 = 83.64


@pytest.fixture(scope="module", params=["1f1b", "gpipe", "interleaved"])
def problem(request: pytest.FixtureRequest, slice_profile) -> EnergyProblem:
    sched = {
        "1f1b": one_f_one_b(4, 6),
        "gpipe": gpipe(4, 5),
        "interleaved": interleaved_1f1b(2, 4, 2),
    }[request.param]
    return EnergyProblem.build(slice_profile(range(4), None), sched, P_A100)


def test_sandwich_bound_is_certified_and_within_its_tolerance(problem) -> None:
    rel = Relaxation.build(problem)
    stats = SandwichStats()
    tol = 5e-4
    sw = sandwich_frontier(problem, rel, tolerance=tol, stats=stats)
    exact = relax(problem, relaxation=rel).relaxed_bound  # every breakpoint
    tb = sw.relaxed_bound
    assert tb.kind == "tangents" and stats.solves >= 2 and stats.gaps[-1] <= tol
    grid = np.r_[np.linspace(sw.t_min, 1.5 * sw.t_max, 1501), exact.times]
    e, s = exact.bound(grid), tb.bound(grid)
    assert (s <= e * (1 + 1e-9)).all()  # below G everywhere
    assert (s >= e * (1 - tol) - 1e-9 * e).all()  # and within the tolerance of it
    np.testing.assert_allclose(tb.bound(sw.times), exact.bound(sw.times), rtol=1e-8)
    # against the independent LP at a few deadlines: below it, within the tolerance
    lp = LPRelaxation(problem)
    for f in (1.0, 1.02, 1.1, 1.3):
        d = max(f * sw.t_min, sw.t_min)
        ref = lp.solve(d).value
        assert tb.bound(d) <= ref * (1 + 1e-9)
        assert tb.bound(d) >= ref * (1 - tol)
    # the kept solutions fit their deadlines, and so do their convex combinations
    for t, d in zip(sw.kept_times, sw.kept_durations, strict=True):
        assert problem.dag.iteration_time(d) <= t * (1 + 1e-12)
    mids = 0.5 * (sw.kept_times[1:] + sw.kept_times[:-1])
    for t, d in zip(mids, sw.durations_at(mids), strict=True):
        assert problem.dag.iteration_time(d) <= t * (1 + 1e-12)


def test_a_tighter_tolerance_takes_more_solves_and_is_tighter(problem) -> None:
    rel = Relaxation.build(problem)
    exact = relax(problem, relaxation=rel).relaxed_bound
    worst = []
    solves = []
    for tol in (1e-2, 1e-4):
        st = SandwichStats()
        tb = sandwich_frontier(problem, rel, tolerance=tol, stats=st).relaxed_bound
        grid = np.linspace(exact.t_min, float(exact.times[-1]), 2001)
        worst.append(float((1 - tb.bound(grid) / exact.bound(grid)).max()))
        solves.append(st.solves)
        assert worst[-1] <= tol
    assert solves[1] > solves[0] and worst[1] < worst[0]


def test_a_solve_with_the_sandwich_core(problem) -> None:
    fr = solve_problem(problem, SolverOptions(relaxation="sandwich"))
    check_frontier(problem, fr)
    assert fr.relaxed_bound.kind == "tangents" and fr.bound_slopes.size == fr.bound_times.size
    exact = solve_problem(problem)
    t0 = fr.max_frequency_time
    for f in (1.0, 1.02, 1.05, 1.1, 1.2):
        d = f * t0
        assert fr.lower_bound_at(d) <= exact.lower_bound_at(d) * (1 + 1e-9)
        # plans as good as the sweep's within half a percent of the bound
        assert fr.energy_at(d) / exact.lower_bound_at(d) - 1 <= 0.005


def test_relaxation_options_are_checked() -> None:
    with pytest.raises(OptionError, match="relaxation: must be one of") as err:
        SolverOptions(relaxation="simplex")
    assert err.value.field == "relaxation"
    for bad in (0.0, 1.0, -1e-3, float("nan"), True):
        with pytest.raises(OptionError, match="sandwich_tolerance"):
            SolverOptions(sandwich_tolerance=bad)


def test_auto_runs_the_sandwich_on_interleaved_v4_and_the_sweep_elsewhere(slice_profile) -> None:
    from perseus.solver.solve import AUTO_SANDWICH_CHUNKS, SolveStats

    profile = slice_profile(range(8), None)
    cases = {
        "sandwich": interleaved_1f1b(2, 4, AUTO_SANDWICH_CHUNKS),
        "sweep": interleaved_1f1b(4, 4, 2),
    }
    for core, sched in cases.items():
        problem = EnergyProblem.build(profile, sched, P_A100)
        stats = SolveStats()
        fr = solve_problem(problem, SolverOptions(relaxation="auto", effort=0), stats=stats)
        assert stats.relaxation == core
        assert (fr.relaxed_bound.kind == "tangents") == (core == "sandwich")
        assert (stats.sandwich is not None) == (core == "sandwich")
        assert set(stats.stages) == {"first plan", "relax", "round", "search", "polish"}
        check_frontier(problem, fr)
