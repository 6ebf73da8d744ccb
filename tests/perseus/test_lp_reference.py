"""The LP oracle (tests/perseus/lp_reference.py) against brute force and exact closed forms.

What is provable, and asserted here:

* ``L(T)`` is at most the energy of every discrete plan finishing by ``T`` (paying blocking power
  until ``T``); checked by enumerating every plan of 2 stages x 2 microbatches x 3 frequencies.
* Once every node can run at its cheapest Pareto option (``T >= cheapest_time``), the relaxation
  is exact: ``L(T) = sum(min costs) + P R T``, which the all-cheapest plan attains.
* With two options per node whose times differ by exactly one unit, integer times and an integer
  deadline, ``L(T)`` equals the best discrete plan: the constraints are difference constraints
  (totally unimodular), so some optimal vertex has integral durations, i.e. every duration at an
  option. (With two options an arbitrary distance apart the LP can run a node in between, so
  there is no equality in general.)
* On one rank (a chain) the relaxation is a separable convex knapsack solved exactly by taking
  the cheapest hull segments first.
* ``L(T) - P R T`` (the compute part) is non-increasing in ``T`` and ``L`` is convex in ``T``.
  ``L`` itself is *not* monotone: past ``cheapest_time`` it grows at exactly ``P R`` per second.
"""

from __future__ import annotations

import csv
import io
import itertools
from pathlib import Path

import numpy as np
import pytest
from lp_reference import LPRelaxation, hull_cost

from perseus.errors import InfeasibleError
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, parse_profile_csv
from perseus.schedules import one_f_one_b

ROOT = Path(__file__).resolve().parents[2]
A100 = ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
P_A100 = 83.64
REL = 1e-9


def sliced_profile(stages: int, freqs: set[int] | None) -> Profile:
    """The real A100 profile cut down to the first ``stages`` stages and the given frequencies."""
    out = io.StringIO()
    with A100.open() as f:
        reader = csv.DictReader(f)
        writer = csv.DictWriter(out, fieldnames=reader.fieldnames or [])
        writer.writeheader()
        for row in reader:
            if int(row["stage"]) < stages and (freqs is None or int(row["frequency"]) in freqs):
                writer.writerow(row)
    return parse_profile_csv(out.getvalue())


def all_plans(problem: EnergyProblem) -> np.ndarray:
    ranges = [range(int(k)) for k in problem.num_options]
    return np.array(list(itertools.product(*ranges)), dtype=np.uint8)


def best_discrete(times: np.ndarray, energies: np.ndarray, problem: EnergyProblem, deadline: float):
    """Least energy of a plan finishing by ``deadline``, blocking power paid until ``deadline``."""
    pr = problem.blocking_power * problem.dag.num_ranks
    ok = times <= deadline * (1 + REL)
    return float((energies[ok] - pr * times[ok]).min() + pr * deadline)


@pytest.fixture(scope="module")
def tiny() -> tuple[EnergyProblem, LPRelaxation, np.ndarray, np.ndarray]:
    profile = sliced_profile(2, {1410, 1200, 1020})
    problem = EnergyProblem.build(profile, one_f_one_b(2, 2), P_A100)
    assert problem.num_nodes == 8 and set(problem.num_options.tolist()) == {3}
    times, energies = problem.evaluate_many(all_plans(problem))
    assert len(times) == 3**8
    return problem, LPRelaxation(problem), times, energies


def test_lower_bound_holds_for_every_discrete_plan(tiny) -> None:
    problem, lp, times, energies = tiny
    # every distinct discrete plan time in range, plus points between them
    ts = np.unique(times[times >= lp.min_time])
    grid = np.unique(np.concatenate([ts[:: max(1, len(ts) // 40)], (ts[:-1:9] + ts[1::9]) / 2]))
    assert len(grid) >= 20
    gaps = []
    for t in grid:
        bound = lp.solve(float(t)).value
        best = best_discrete(times, energies, problem, float(t))
        assert bound <= best * (1 + REL), (t, bound, best)
        gaps.append((best - bound) / best)
    # the bound is not vacuous: the relaxation is within a few percent of the discrete optimum
    assert max(gaps) < 0.05
    assert min(gaps) < 1e-9  # and exact somewhere (at the cheap end at least)


def test_exact_once_every_node_can_be_cheapest(tiny) -> None:
    problem, lp, times, energies = tiny
    pr = problem.blocking_power * problem.dag.num_ranks
    for t in (lp.cheapest_time, lp.cheapest_time * 1.1):
        sol = lp.solve(t)
        assert sol.value == pytest.approx(lp.min_compute_cost + pr * t, rel=REL)
        assert sol.value == pytest.approx(best_discrete(times, energies, problem, t), rel=REL)


def test_durations_are_feasible_and_priced_by_the_hull(tiny) -> None:
    problem, lp, _, _ = tiny
    for t in np.linspace(lp.min_time, lp.cheapest_time, 7):
        sol = lp.solve(float(t))
        d = sol.durations
        assert np.all(d >= lp.fastest - 1e-9) and np.all(d <= lp.slowest + 1e-9)
        assert problem.dag.iteration_time(d) <= t * (1 + 1e-7)
        priced = sum(hull_cost(ht, hc, di) for (ht, hc), di in zip(lp.hulls, d, strict=True))
        assert sol.compute_cost == pytest.approx(priced, rel=1e-7)


def test_monotone_compute_part_and_convex(tiny) -> None:
    problem, lp, _, _ = tiny
    pr = problem.blocking_power * problem.dag.num_ranks
    grid = np.linspace(lp.min_time, lp.cheapest_time * 1.05, 41)
    values = np.array([lp.solve(float(t)).value for t in grid])
    compute = values - pr * grid
    scale = abs(values).max()
    assert np.all(np.diff(compute) <= 1e-9 * scale)
    assert np.all(np.diff(values, 2) >= -1e-7 * scale)
    beyond = grid >= lp.cheapest_time
    slopes = np.diff(values[beyond]) / np.diff(grid[beyond])
    assert slopes == pytest.approx(np.full_like(slopes, pr), rel=1e-6)


def test_deadline_below_fastest_is_infeasible(tiny) -> None:
    _, lp, times, _ = tiny
    assert lp.min_time == pytest.approx(times.min(), rel=REL)
    lp.solve(lp.min_time)
    with pytest.raises(InfeasibleError, match="fastest possible"):
        lp.solve(lp.min_time * 0.999)
    with pytest.raises(InfeasibleError):
        lp.solve(float("nan"))


def synthetic_unit_step_profile(rng: np.random.Generator, stages: int, power: float) -> Profile:
    """Two options per (stage, instruction).

    Integer time t and t + 1, the slower one cheaper in effective cost (energy - power * time).
    """
    lines = ["stage,instruction,frequency,time,energy"]
    for s in range(stages):
        for kind in ("forward", "backward"):
            t = int(rng.integers(2, 6))
            e = float(rng.uniform(100, 200))
            saving = float(rng.uniform(1, 40))
            lines.append(f"{s},{kind},1000,{t},{e!r}")
            lines.append(f"{s},{kind},900,{t + 1},{e + power - saving!r}")
    return parse_profile_csv("\n".join(lines) + "\n")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_with_unit_step_two_options(seed: int) -> None:
    power = 50.0
    profile = synthetic_unit_step_profile(np.random.default_rng(seed), 2, power)
    problem = EnergyProblem.build(profile, one_f_one_b(2, 3), power)
    times, energies = problem.evaluate_many(all_plans(problem))
    lp = LPRelaxation(problem)
    assert lp.min_time == int(lp.min_time)
    for t in range(int(lp.min_time), int(lp.cheapest_time) + 2):
        bound = lp.solve(float(t)).value
        assert bound == pytest.approx(best_discrete(times, energies, problem, float(t)), rel=1e-9)


def greedy_chain(lp: LPRelaxation, power: float, deadline: float) -> float:
    """Exact continuous optimum on one rank.

    Start cheapest, buy back time along the hull segments of least cost per second first.
    """
    segments = []
    for t, c in lp.hulls:
        for k in range(len(t) - 1):
            segments.append(((c[k] - c[k + 1]) / (t[k + 1] - t[k]), t[k + 1] - t[k]))
    segments.sort()
    excess = float(lp.slowest.sum()) - deadline
    cost = lp.min_compute_cost
    for rate, length in segments:
        if excess <= 0:
            break
        take = min(length, excess)
        cost += rate * take
        excess -= take
    return cost + power * deadline


def test_chain_matches_greedy_knapsack() -> None:
    problem = EnergyProblem.build(sliced_profile(1, None), one_f_one_b(1, 3), P_A100)
    lp = LPRelaxation(problem)
    assert lp.min_time == pytest.approx(float(lp.fastest.sum()))
    assert sum(len(t) for t, _ in lp.hulls) > 3 * problem.num_nodes  # many hull segments
    for t in np.linspace(lp.min_time, lp.cheapest_time * 1.02, 15):
        assert lp.solve(float(t)).value == pytest.approx(
            greedy_chain(lp, P_A100, float(t)), rel=1e-9
        )
