"""The relaxation's contract (:class:`perseus.bound.RelaxedBound`).

Breakpoints and tangent lines give a certified bound, checked against the independent LP
(``tests/perseus/lp_reference.py``); a frontier carries either (JSON included; old frontiers still
load), and every user of the bound goes through it.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from lp_reference import LPRelaxation

from perseus.bound import RelaxedBound
from perseus.frontier import Frontier
from perseus.power.plan_power import bound_time_for_power
from perseus.problem import EnergyProblem
from perseus.schedules import gpipe, interleaved_1f1b, one_f_one_b
from perseus.solver import SolverOptions, solve_problem
from perseus.solver.stages import relax

P_A100 = 83.64
FACTORS = (1.0, 1.01, 1.03, 1.1, 1.3)


@pytest.fixture(scope="module", params=["1f1b", "gpipe", "interleaved"])
def problem(request: pytest.FixtureRequest, slice_profile) -> EnergyProblem:
    sched = {
        "1f1b": one_f_one_b(4, 6),
        "gpipe": gpipe(4, 5),
        "interleaved": interleaved_1f1b(2, 4, 2),
    }[request.param]
    stages = range(4)
    return EnergyProblem.build(slice_profile(stages, None), sched, P_A100)


def deadlines(rb: RelaxedBound, t0: float) -> list[float]:
    return [max(f * t0, rb.t_min) for f in FACTORS]


def test_breakpoint_bound_equals_the_lp_and_its_slope_is_a_subgradient(problem) -> None:
    relaxed = relax(problem)  # exact hulls: the breakpoints of G itself
    rb = relaxed.relaxed_bound
    assert rb.kind == "breakpoints"
    lp = LPRelaxation(problem)
    t0 = float(problem.dag.iteration_time(relaxed.relaxation.shortest))
    grid = np.linspace(rb.t_min, 2 * relaxed.t_max, 801)
    for d in deadlines(rb, t0):
        ref = lp.solve(d)
        assert rb.bound(d) <= ref.value * (1 + 1e-9)
        assert rb.bound(d) == pytest.approx(ref.value, rel=1e-7)
        # the LP's supporting line lies below the sweep's bound everywhere (both certified)
        line = ref.value + ref.slope * (grid - d)
        assert (line <= rb.bound(grid) + 1e-7 * ref.value).all()
        # and the bound's own slope there is a subgradient: its line is below the bound too
        own = rb.bound(d) + rb.slope(d) * (grid - d)
        assert (own <= rb.bound(grid) + 1e-9 * ref.value).all()


def test_tangents_from_the_lp_are_certified_and_exact_at_their_deadlines(problem) -> None:
    relaxed = relax(problem)
    exact = relaxed.relaxed_bound
    lp = LPRelaxation(problem)
    t0 = float(problem.dag.iteration_time(relaxed.relaxation.shortest))
    ds = np.array(deadlines(exact, t0) + [relaxed.t_max * 1.01])
    sols = [lp.solve(float(d)) for d in ds]
    tan = RelaxedBound.tangents(ds, [s.value for s in sols], [s.slope for s in sols])
    grid = np.linspace(exact.t_min, 2 * relaxed.t_max, 1001)
    scale = float(exact.bound(exact.t_min))
    assert (tan.bound(grid) <= exact.bound(grid) + 1e-7 * scale).all()
    np.testing.assert_allclose(tan.bound(ds), exact.bound(ds), rtol=1e-7)
    assert tan.bound(exact.t_min * 0.99) == math.inf


def test_tangents_from_exact_samples_lie_below_the_breakpoints(problem) -> None:
    exact = relax(problem).relaxed_bound
    lo, hi = exact.t_min, 1.5 * float(exact.times[-1])
    rng = np.random.default_rng(7)
    for count in (1, 3, 12):
        ds = np.sort(np.r_[lo, rng.uniform(lo, hi, count - 1)])
        tan = RelaxedBound.tangents(ds, exact.bound(ds), exact.slope(ds))
        grid = np.r_[np.linspace(lo, hi, 2001), exact.times]
        ex, tg = exact.bound(grid), tan.bound(grid)
        assert (tg <= ex + 1e-9 * np.abs(ex)).all(), count
        np.testing.assert_allclose(tan.bound(ds), exact.bound(ds), rtol=1e-12)
        # a looser bound allows an earlier time under a power budget, never a later one
        for w in np.linspace(ex.min() / hi, 1.2 * ex.max() / lo, 9):
            assert tan.time_for_power(float(w)) <= exact.time_for_power(float(w)) * (1 + 1e-9)
    # tangents at every breakpoint (and past the last) are the breakpoints' bound itself
    ds = np.r_[exact.times, hi]
    full = RelaxedBound.tangents(ds, exact.bound(ds), exact.slope(ds))
    grid = np.linspace(lo, hi, 997)
    np.testing.assert_allclose(full.bound(grid), exact.bound(grid), rtol=1e-9)


def test_a_frontier_with_tangents_uses_them(problem) -> None:
    """Interpolating tangent points would put the bound above ``G`` between them.

    The frontier (``lower_bound_at``, JSON, power budgets) must read the lines.
    """
    fr = solve_problem(problem, SolverOptions(effort=0))
    exact = fr.relaxed_bound
    t0, t1 = fr.max_frequency_time, float(exact.times[-1])
    ds = np.array([max(t0, exact.t_min), 0.5 * (t0 + t1), t1])
    tan = replace(fr, bound_energies=exact.bound(ds), bound_times=ds, bound_slopes=exact.slope(ds))
    assert tan.relaxed_bound.kind == "tangents"
    mids = 0.5 * (ds[1:] + ds[:-1])
    for m in mids:
        chord = float(np.interp(m, ds, tan.bound_energies))
        assert tan.lower_bound_at(float(m)) <= fr.lower_bound_at(float(m)) * (1 + 1e-12)
        assert tan.lower_bound_at(float(m)) <= chord * (1 + 1e-12)
    # every plan stays above the tangent bound at its own time
    for t, e in zip(fr.times, fr.energies, strict=True):
        assert tan.lower_bound_at(float(t)) <= e * (1 + 1e-9)
    back = Frontier.from_json(json.loads(json.dumps(tan.to_json(compact=True))))
    np.testing.assert_array_equal(back.bound_slopes, tan.bound_slopes)
    for d in np.linspace(ds[0], 2 * ds[-1], 17):
        assert back.lower_bound_at(float(d)) == tan.lower_bound_at(float(d))
    for w in np.linspace(0.5, 2.0, 7) * fr.energies[0] / fr.times[0]:
        tb = bound_time_for_power(tan, float(w))
        assert tb <= bound_time_for_power(fr, float(w)) * (1 + 1e-9)
        if math.isfinite(tb):
            assert tan.lower_bound_at(tb) <= w * tb * (1 + 1e-9)


def test_old_frontier_json_still_loads(problem) -> None:
    """A frontier stored before tangents (no ``bound_slopes``), or before any bound."""
    fr = solve_problem(problem, SolverOptions(effort=0))
    doc = json.loads(json.dumps(fr.to_json(compact=True)))
    assert "bound_slopes" not in doc["encoded"]  # breakpoints are written as they always were
    old = Frontier.from_json(doc)
    assert old.relaxed_bound.kind == "breakpoints"
    for d in np.linspace(fr.times[0], 2 * fr.times[-1], 13):
        assert old.lower_bound_at(float(d)) == fr.lower_bound_at(float(d))
    for key in ("bound_times", "bound_energies"):
        del doc["encoded"][key]
    older = Frontier.from_json(doc)
    assert older.lower_bound_at(float(fr.times[0])) == math.inf
    with pytest.raises(ValueError, match="no relaxed bound"):
        bound_time_for_power(older, 1e6)


def test_bad_bounds_are_rejected() -> None:
    with pytest.raises(ValueError, match="2 times but 1 values"):
        RelaxedBound.breakpoints([1.0, 2.0], [3.0], 1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        RelaxedBound.breakpoints([2.0, 1.0], [3.0, 4.0], 1.0)
    with pytest.raises(ValueError, match="finite"):
        RelaxedBound.tangents([1.0], [math.nan], [0.0])
    with pytest.raises(ValueError, match="slopes"):
        RelaxedBound.tangents([1.0, 2.0], [1.0, 1.0], [0.0])
    with pytest.raises(ValueError, match="no relaxed solutions"):
        RelaxedBound.breakpoints([1.0], [1.0], 1.0).durations_at(np.array([1.0]))


def test_hand_made_tangents() -> None:
    """B(T) = max(10 - 4 (T - 1), 6 + (T - 2)) on T >= 1: the lines cross at T = 2."""
    tb = RelaxedBound.tangents([1.0, 2.0], [10.0, 6.0], [-4.0, 1.0])
    assert tb.bound(0.5) == math.inf and math.isnan(tb.slope(0.5))
    assert tb.bound(1.8) == pytest.approx(6.8) and tb.bound(3.0) == pytest.approx(7.0)
    assert tb.slope(1.5) == -4.0 and tb.slope(2.5) == 1.0
    # least T with B(T) <= w T: w = 4 -> 10 - 4 (T - 1) <= 4 T -> T >= 1.75; 6 + T - 2 <= 4T ok
    assert tb.time_for_power(4.0) == pytest.approx(1.75)
    assert tb.time_for_power(100.0) == 1.0  # already under at the fastest time
    assert tb.time_for_power(0.5) == math.inf  # B(T) grows at 1 W past 2 s: never under 0.5 T
    bp = RelaxedBound.breakpoints([1.0, 1.8, 2.0], [10.0, 6.8, 6.0], 1.0)
    assert bp.time_for_power(4.0) == pytest.approx(1.75)
    assert tb.to_json()["slopes"] == [-4.0, 1.0] and bp.to_json()["tail_slope"] == 1.0
