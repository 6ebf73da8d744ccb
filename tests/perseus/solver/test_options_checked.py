"""The solver's options (``perseus.solver.options``): SolverOptions and RoundingOptions.

Every bad value is refused by name, the defaults are the solver's, and the options reach the stages
they govern.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from solver_instances import KNAPSACK_CSV, knapsack_problem

from perseus.errors import OptionError
from perseus.problem import EnergyProblem
from perseus.profiles import parse_profile_csv
from perseus.schedules import one_f_one_b
from perseus.solver import (
    Relaxation,
    Rounder,
    RoundingOptions,
    SolverOptions,
    solve_frontier,
    solve_problem,
)

BAD_SOLVER = [
    ("initial_candidates", 0),
    ("initial_candidates", 1.5),
    ("refine_rounds", -1),
    ("refine_batch", True),
    ("hard_rounds", -2),
    ("hard_intervals", "8"),
    ("random_trials", -1),
    ("polish_plans", -1),
    ("polish_nodes", None),
    ("search_work", -1),
    ("search_intervals", 2.0),
    ("seed", -1),
    ("target_gap", -1e-4),
    ("target_gap", math.nan),
    ("hard_gap", math.inf),
    ("effort", -1.0),
    ("effort", math.nan),
    ("effort", math.inf),
    ("effort", "1"),
    ("hull_tolerance", -1e-4),
    ("hull_tolerance", math.nan),
    ("diagonal_rounding", 1),
    ("rounding", {"levels": 3}),
]
BAD_ROUNDING = [
    ("levels", -1),
    ("decay", 0.0),
    ("decay", 1.5),
    ("max_rounds", 0),
    ("exchange_passes", -1),
    ("free_levels", 0.5),
    ("free_decay", math.nan),
]


@pytest.mark.parametrize(("name", "value"), BAD_SOLVER)
def test_bad_solver_options_are_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(OptionError, match=f"^{name}: ") as err:
        SolverOptions(**{name: value})  # type: ignore[arg-type]
    assert err.value.field == name


@pytest.mark.parametrize(("name", "value"), BAD_ROUNDING)
def test_bad_rounding_options_are_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(OptionError, match=f"^{name}: ") as err:
        RoundingOptions(**{name: value})  # type: ignore[arg-type]
    assert err.value.field == name


def test_options_are_frozen_and_replace_is_checked_again() -> None:
    opts = SolverOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.effort = 2.0  # type: ignore[misc]
    assert dataclasses.replace(opts, effort=np.float64(2.0)).effort == 2.0
    assert SolverOptions(seed=np.int64(3)).seed == 3  # type: ignore[arg-type]  # numpy ints too
    with pytest.raises(OptionError, match="effort"):
        dataclasses.replace(opts, effort=-1)


def test_defaults_are_the_solvers() -> None:
    assert SolverOptions() == SolverOptions(
        initial_candidates=192, refine_rounds=5, refine_batch=64, target_gap=2e-4,
        hard_gap=2.5e-3, hard_rounds=3, hard_intervals=8, random_trials=24, polish_plans=16,
        polish_nodes=4096, effort=1.0, search_work=400_000, search_intervals=16,
        diagonal_rounding=True, seed=0, hull_tolerance=5e-4,
        rounding=RoundingOptions(levels=12, decay=0.7, max_rounds=8, exchange_passes=0,
                                 free_levels=2, free_decay=0.2),
    )  # fmt: skip


def test_solve_problem_takes_only_solver_options() -> None:
    with pytest.raises(OptionError, match="options"):
        solve_problem(knapsack_problem(), {"effort": 0})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        solve_problem(knapsack_problem(), effort=0)  # type: ignore[call-arg]


def test_solve_frontier_effort_replaces_the_options_effort() -> None:
    profile, schedule = parse_profile_csv(KNAPSACK_CSV), one_f_one_b(2, 1)
    with pytest.raises(OptionError, match="effort"):
        solve_frontier(profile, schedule, 0.0, effort=-1.0)
    with pytest.raises(OptionError, match="effort"):
        solve_frontier(profile, schedule, 0.0, options=SolverOptions(), effort=math.nan)
    a = solve_frontier(profile, schedule, 0.0, options=SolverOptions(effort=3), effort=0)
    b = solve_problem(knapsack_problem(), SolverOptions(effort=0))
    assert np.array_equal(a.plans, b.plans) and np.array_equal(a.energies, b.energies)


def test_rounding_options_reach_the_rounder() -> None:
    """With ``exchange_passes`` set, a plain reclaim exchanges too.

    From the 0.1937 s plan it reaches the 0.1969 s one, which reclaiming alone cannot.
    """
    problem = knapsack_problem()
    rel = Relaxation.build(problem)
    start = solve_problem(problem).plans[1][None, :]
    deadline = np.array([0.1978])
    plain = Rounder(problem, rel)
    assert np.array_equal(plain.reclaim(start, deadline), start)
    exchanging = Rounder(problem, rel, RoundingOptions(exchange_passes=2))
    swapped = problem.evaluate(exchanging.reclaim(start, deadline)[0])
    assert swapped.time == pytest.approx(0.1969)
    assert swapped.energy == pytest.approx(16.0)


def test_the_seed_changes_only_what_is_random(slice_profile) -> None:
    """Another seed gives another (still valid) search; the same seed the same frontier."""
    profile = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855})
    problem = EnergyProblem.build(profile, one_f_one_b(4, 6), 83.64)
    a = solve_problem(problem, SolverOptions(hard_gap=0.0, seed=1))
    b = solve_problem(problem, SolverOptions(hard_gap=0.0, seed=1))
    assert np.array_equal(a.plans, b.plans)
    assert np.array_equal(a.bound_times, solve_problem(problem).bound_times)  # relax: no seed
    t, e = problem.evaluate_many(a.plans)
    assert np.array_equal(t, a.times) and np.array_equal(e, a.energies)


@pytest.mark.parametrize("effort", [-1.0, float("nan"), float("inf")])
def test_bad_effort_is_rejected_by_name(effort: float) -> None:
    with pytest.raises(OptionError, match="effort"):
        solve_problem(knapsack_problem(), SolverOptions(effort=effort))
