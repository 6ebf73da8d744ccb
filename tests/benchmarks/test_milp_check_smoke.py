"""The exact solvers that ``benchmarks/milp_check.py`` puts beside Perseus, and its ``--smoke`` run.

Its figures are only evidence if the MILP really finds the optimum, and if a time window's MILP (the
others fixed, entering only as release and due times) really is the whole problem restricted to the
window. The smoke run, as a user runs it, reads its table, never its timings.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from benchmark_run import run

from benchmarks.milp_check import energy_at, milp_plan, window_milp, window_rounds
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import Relaxation, Rounder, SolverOptions, solve_problem

FREQS = (1410, 1200, 1020)
A100_BLOCKING_POWER = 83.64  # W, measured with the A100 profile


@pytest.fixture(scope="module")
def tiny(slice_profile) -> EnergyProblem:
    """2 stages x 3 microbatches x 3 clocks: 12 instructions, 3**12 plans to enumerate."""
    return EnergyProblem.build(slice_profile((0, 1), FREQS), one_f_one_b(2, 3), A100_BLOCKING_POWER)


def _all_plans(problem: EnergyProblem, nodes: np.ndarray, base: np.ndarray) -> np.ndarray:
    """``base`` with every combination of options on ``nodes``."""
    combos = np.array(
        list(itertools.product(*[range(int(problem.num_options[v])) for v in nodes])),
        dtype=np.uint8,
    )
    plans = np.repeat(base[None, :], len(combos), axis=0)
    plans[:, nodes] = combos
    return plans


def _best_within(problem: EnergyProblem, plans: np.ndarray, deadline: float) -> float:
    times, energies = problem.evaluate_many(plans)
    ranks = problem.dag.num_ranks
    fits = times <= deadline * (1 + 1e-12)
    return float(np.min(energies[fits] + problem.blocking_power * ranks * (deadline - times[fits])))


@pytest.mark.parametrize("slowdown", [1.0, 1.03, 1.1])
def test_the_milp_finds_the_enumerated_optimum(tiny: EnergyProblem, slowdown: float) -> None:
    t0 = tiny.evaluate(tiny.max_frequency_plan()).time
    deadline = slowdown * t0
    every = _all_plans(tiny, np.arange(tiny.num_nodes), tiny.max_frequency_plan())
    plan, dual, optimal = milp_plan(tiny, deadline, time_limit=60)
    assert plan is not None and optimal
    best = _best_within(tiny, every, deadline)
    assert energy_at(tiny, plan, deadline) == pytest.approx(best, rel=1e-9)
    assert dual <= best * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_a_window_milp_is_the_problem_restricted_to_the_window(
    tiny: EnergyProblem, seed: int
) -> None:
    """A window's MILP equals the best of every combination of the window's options.

    With every instruction outside a time window fixed, the window's MILP equals the best of
    every combination of the window's options.
    """
    rng = np.random.default_rng(seed)
    t0 = tiny.evaluate(tiny.max_frequency_plan()).time
    deadline = (1.02 + 0.06 * rng.random()) * t0
    frontier = solve_problem(tiny, SolverOptions(effort=0))
    plan = frontier.plans[frontier.index_for_deadline(deadline, wait=True)]
    start = tiny.dag.earliest_start(tiny.durations(plan))
    # a window: every instruction starting between the k-th and the (k + 3..5)-th start
    order = np.argsort(start, kind="stable")
    first = int(rng.integers(0, tiny.num_nodes - 6))
    last = first + int(rng.integers(3, 6))
    window = (start >= start[order[first]]) & (start <= start[order[last]])
    opts = [np.flatnonzero(Relaxation.build(tiny).pareto[v]) for v in range(tiny.num_nodes)]
    got = window_milp(tiny, opts, plan, window, deadline)
    assert got is not None
    assert np.array_equal(got[~window], plan[~window])
    # dominated options never help, so enumerating them all is a fair check
    best = _best_within(tiny, _all_plans(tiny, np.flatnonzero(window), plan), deadline)
    assert energy_at(tiny, got, deadline) == pytest.approx(best, rel=1e-9)


def test_window_rounds_only_improve_and_keep_the_deadline(slice_profile) -> None:
    problem = EnergyProblem.build(
        slice_profile(range(4), None), one_f_one_b(4, 6), A100_BLOCKING_POWER
    )
    frontier = solve_problem(problem, SolverOptions(effort=0))
    deadline = 1.01 * frontier.max_frequency_time
    plan = frontier.plans[frontier.index_for_deadline(deadline, wait=True)]
    rounder = Rounder(problem, Relaxation.build(problem))
    better = window_rounds(problem, plan, deadline, rounds=1, search=0, rounder=rounder)
    assert problem.evaluate(better).time <= deadline * (1 + 1e-9)
    assert energy_at(problem, better, deadline) <= energy_at(problem, plan, deadline)


def test_milp_check_benchmark_smoke() -> None:
    """``--smoke``: one small input and deadline; the bound is below both plans' energies."""
    out = run("milp_check.py", "--smoke", timeout=600)
    lines = out.splitlines()
    assert lines[0].startswith("A40 ") and "T0 = " in lines[0]
    [row] = [line for line in lines if line.strip().startswith("1.0500T0")]
    bound, perseus, milp = (float(x) for x in row.split()[1:4])
    assert 0 < bound <= perseus and bound <= milp, row
    assert "optimal" in row or "best found" in row
