"""The solver at scale (``perseus.solver.solve``).

Bounded relaxed memory, the early zero-slowdown plan (``first_plan``), deep pipelines, and a solve
on thinned hulls. Elsewhere: the sweep's kept durations in ``test_breakpoints.py``, the hulls
themselves in ``test_relaxation_hulls.py``, the sweep kernel's flow repairs in
``tests/perseus/kernels/test_relaxed.py``, the compiled kernels in ``kernels/test_cache.py`` and
``kernels/test_warm.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lp_reference import lp_lower_bound
from solver_instances import REL, check_frontier, smooth

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import InstructionProfile, Profile
from perseus.schedules import interleaved_1f1b, one_f_one_b
from perseus.solver import (
    Relaxation,
    SolverOptions,
    first_plan,
    solve_problem,
)
from perseus.solver.rounder import Rounder

# --- bounded relaxed memory ------------------------------------------------------------------


def test_a_small_relaxed_memory_keeps_the_bound_and_valid_plans() -> None:
    problem = EnergyProblem.build(smooth(4, 32), one_f_one_b(4, 12), 80.0)
    small = solve_problem(problem, SolverOptions(relaxed_memory=1))
    full = solve_problem(problem)
    check_frontier(problem, small)
    assert np.array_equal(small.bound_times, full.bound_times)
    t0 = full.max_frequency_time
    for f in (1.0, 1.02, 1.1):
        assert small.energy_at(f * t0) <= full.energy_at(f * t0) * 1.01


# --- the early zero-slowdown plan -----------------------------------------------------------


def test_the_first_plan_comes_before_the_sweep_and_is_certified() -> None:
    """The first plan comes before any progress of the sweep, and it is certified.

    One call, before any progress of the sweep, with one verified zero-slowdown point whose
    bound is below the exact relaxed bound at every deadline; the final frontier's fastest plan
    is at least as good.
    """
    problem = EnergyProblem.build(smooth(4, 16), one_f_one_b(4, 8), 80.0)
    progress: list[float] = []
    got: list[tuple[int, Frontier]] = []
    fr = solve_problem(
        problem,
        progress=progress.append,
        on_first_plan=lambda f: got.append((len(progress), f)),
    )
    assert len(got) == 1
    seen, early = got[0]
    assert seen == 0
    assert len(early) == 1 and early.plans.shape == (1, problem.num_nodes)
    check_frontier(problem, early)
    assert early.times[0] <= early.max_frequency_time * (1 + REL)
    assert early.energies[0] < early.max_frequency_energy
    assert early.lower_bounds[0] == pytest.approx(early.lower_bound_at(float(early.times[0])))
    t0 = fr.max_frequency_time
    for f in np.linspace(1.0, 3.0, 41):
        assert early.lower_bound_at(f * t0) <= fr.lower_bound_at(f * t0) * (1 + REL)
    assert fr.energy_at(t0) <= early.energy_at(t0) * (1 + REL)
    again = Frontier.from_json(early.to_json(compact=True))
    assert np.array_equal(again.plans, early.plans)


def test_first_plan_falls_back_to_max_frequency_when_nothing_can_slow() -> None:
    """A single option per node: the first plan is the all-max-frequency plan."""
    f = np.array([1410], dtype=np.int64)
    prof = Profile(
        {(s, k): InstructionProfile(f, np.array([0.01]), np.array([1.0]))
         for s in range(2) for k in ("forward", "backward")}
    )  # fmt: skip
    problem = EnergyProblem.build(prof, one_f_one_b(2, 2), 50.0)
    rel = Relaxation.build(problem)
    early = first_plan(problem, rel, Rounder(problem, rel))
    assert np.array_equal(early.plans[0], problem.max_frequency_plan())
    assert early.lower_bounds[0] <= early.energies[0] * (1 + REL)


# --- deep pipelines --------------------------------------------------------------------------


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(16, 32),
    st.integers(1, 3),
    st.integers(3, 12),
    st.floats(0.0, 150.0),
    st.integers(0, 2**16),
)
def test_deep_pipelines(stages: int, microbatches: int, clocks: int, power: float, seed: int):
    """16-32 stages, few microbatches.

    Plans are truly evaluated, the fastest within T0, every point above its bound, and the bound
    equal to an independent LP's at T0 and 1.1 T0.
    """
    problem = EnergyProblem.build(
        smooth(stages, clocks, seed), one_f_one_b(stages, microbatches), power
    )
    fr = solve_problem(problem, SolverOptions(effort=0.0))
    check_frontier(problem, fr)
    for f in (1.0, 1.1):
        d = f * fr.max_frequency_time
        assert fr.lower_bound_at(d) == pytest.approx(lp_lower_bound(problem, d).value, rel=1e-6)


def test_deep_interleaved_pipeline() -> None:
    problem = EnergyProblem.build(smooth(16, 8), interleaved_1f1b(16, 16, 2), 80.0)
    fr = solve_problem(problem, SolverOptions(effort=0.0))
    check_frontier(problem, fr)
    t0 = fr.max_frequency_time
    assert fr.energy_at(t0) / fr.lower_bound_at(t0) - 1 < 0.02


# --- fewer hull pieces for the sweep ---------------------------------------------------------


def test_thinned_sweep_bound_is_certified_and_close():
    """On a fine-grained profile the sweep on thinned hulls visits fewer breakpoints.

    Its bound lies below the independent LP's (on the exact hulls) and within ``hull_tolerance``
    of the energy of it; with ``hull_tolerance=0`` it equals the LP's.
    """
    problem = EnergyProblem.build(smooth(4, 48, seed=3), one_f_one_b(4, 6), 80.0)
    tol = 2e-3
    thin = solve_problem(problem, SolverOptions(effort=0.0, hull_tolerance=tol))
    exact = solve_problem(problem, SolverOptions(effort=0.0, hull_tolerance=0.0))
    check_frontier(problem, thin)
    assert len(thin.bound_times) < 0.8 * len(exact.bound_times)
    floor = problem.energies.min(axis=1).sum()  # every option is valid in this profile
    for f in (1.0, 1.02, 1.1, 1.3):
        d = f * thin.max_frequency_time
        ref = lp_lower_bound(problem, d).value
        assert exact.lower_bound_at(d) == pytest.approx(ref, rel=1e-6)
        assert thin.lower_bound_at(d) <= ref * (1 + 1e-9)
        assert thin.lower_bound_at(d) >= ref - tol * floor - 1e-9 * ref
