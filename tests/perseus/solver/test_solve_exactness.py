"""The solve's exactness on tiny instances (``perseus.solver.solve``), against brute force.

Instances cut from the real A100 profile, small enough to enumerate every plan: every reported
plan is a real one, never better than the truth, and where enumeration finds a better one the
reported bound is still below it; the ends of the frontier are exact and its coverage between
them is within a measured bound.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from solver_instances import waiting_energy

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, load_profile, parse_profile_json
from perseus.schedules import Schedule, make_schedule, one_f_one_b
from perseus.solver import (
    solve_frontier,
)

P_A100 = 83.64
A100_CSV = Path(__file__).resolve().parents[3] / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
REL = 1e-9


@dataclass(frozen=True)
class Tiny:
    """A tiny instance cut from the real A100 profile, small enough to enumerate every plan."""

    name: str
    stages: tuple[int, ...]
    freqs: frozenset[int]
    schedule: Schedule


@dataclass(frozen=True)
class Enumerated:
    frontier: Frontier  # the solver's
    times: np.ndarray  # of every discrete plan
    energies: np.ndarray
    wait: np.ndarray  # energy - P R time
    front: np.ndarray  # indices of the true Pareto frontier in (time, wait), by time


TINY = [
    Tiny("1f1b-2x2-3f", (0, 1), frozenset({1410, 1200, 1020}), one_f_one_b(2, 2)),
    Tiny("1f1b-2x2-3f-s37", (3, 7), frozenset({1410, 1110, 855}), one_f_one_b(2, 2)),
    Tiny("gpipe-2x2-3f", (0, 1), frozenset({1410, 1200, 1020}), make_schedule("gpipe", 2, 2)),
    Tiny("gpipe-2x2-3f-s37", (3, 7), frozenset({1410, 1110, 855}), make_schedule("gpipe", 2, 2)),
    Tiny("1f1b-2x3-2f", (0, 1), frozenset({1410, 1005}), one_f_one_b(2, 3)),
    Tiny("1f1b-3x2-2f", (0, 1, 2), frozenset({1410, 1005}), one_f_one_b(3, 2)),
    Tiny(
        "interleaved-2x2x2-2f",
        (0, 1),
        frozenset({1410, 1005}),
        make_schedule("interleaved-1f1b", 2, 2, 2),
    ),
]


TINY_IDS = [t.name for t in TINY]


#: Measured worst relative gap between the solver's energy_at(T) and the true discrete optimum,
#: over the true frontier's times, per instance: 2.21 %, 3.24 %, 3.49 %, 4.75 %, 3.69 %, 2.01 %,
#: 2.87 % (the solver's discrete plans are the relaxation's breakpoints rounded, so plans between
#: breakpoints are missed). Asserted with margin.
COVERAGE_BOUND = 0.06


#: Instances where the solver reports a point that an enumerated plan dominates (see the test).
#: How far (relative energy) a reported plan may sit above the true discrete optimum at its own
#: time on these tiny instances. Rounding is a heuristic: the guarantee is the certified bound.
DOMINATED_BOUND = 0.02


@functools.cache
def enumerated(case: Tiny) -> Enumerated:
    profile = _slice(case.stages, case.freqs)
    problem = EnergyProblem.build(profile, case.schedule, P_A100)
    plans = np.array(
        list(itertools.product(*[range(int(k)) for k in problem.num_options])), dtype=np.uint8
    )
    assert len(plans) == len(case.freqs) ** problem.num_nodes
    times, energies = problem.evaluate_many(plans)
    wait = energies - P_A100 * case.schedule.ranks * times
    front, best = [], np.inf
    for i in np.lexsort((wait, times)):
        if wait[i] < best - REL * abs(wait[i]):
            front.append(i)
            best = wait[i]
    fr = solve_frontier(profile, case.schedule, P_A100)
    return Enumerated(fr, times, energies, wait, np.asarray(front))


def _slice(stages: tuple[int, ...], freqs: frozenset[int]) -> Profile:
    a100 = load_profile(A100_CSV)
    renumber = {s: i for i, s in enumerate(stages)}
    records = [
        {**r, "stage": renumber[r["stage"]]}
        for r in a100.records()
        if r["stage"] in renumber and r["frequency"] in freqs
    ]
    return parse_profile_json({"records": records})


@pytest.mark.parametrize("case", TINY, ids=TINY_IDS)
def test_every_solver_point_is_on_the_true_frontier_or_its_gap_is_honest(case: Tiny) -> None:
    """Each reported plan is a real plan.

    Where enumeration finds a better one at the same time, the reported lower bound is still
    below that optimum (the gap shown is honest), and the excess is small.
    """
    en = enumerated(case)
    fr = en.frontier
    dominated = 0
    for i, (t, w) in enumerate(zip(fr.times, waiting_energy(fr), strict=True)):
        fits = en.times <= t * (1 + REL)
        best = en.wait[fits].min()  # the true optimum at this time, waiting included
        assert best <= w * (1 + REL) + REL  # never better than the truth: it is a real plan
        assert fr.lower_bounds[i] <= best + P_A100 * case.schedule.ranks * t + 1e-9
        if best < w - REL * abs(w):
            dominated += 1
            excess = (w - best) / (best + P_A100 * case.schedule.ranks * t)
            assert excess <= DOMINATED_BOUND, (case.name, i, excess)
    assert dominated <= len(fr) // 2, (case.name, dominated, len(fr))


@pytest.mark.parametrize("case", TINY, ids=TINY_IDS)
def test_solver_ends_exact_and_covers_the_true_frontier(case: Tiny) -> None:
    en = enumerated(case)
    fr = en.frontier
    fw = waiting_energy(fr)
    # the ends are exact: the fastest possible time, and the least energy-with-waiting
    fastest = en.times.min()
    assert fr.times[0] == pytest.approx(fastest, rel=REL)
    assert fw[0] == pytest.approx(en.wait[en.times <= fastest * (1 + REL)].min(), rel=REL)
    assert fw[-1] == pytest.approx(en.wait.min(), rel=REL)
    # every reported point is a real plan with its true (T, E)
    assert len(fr) <= len(en.front) + 10  # and not a flood of them
    # coverage: at each true frontier point's time, how far above it is the solver?
    gaps = [(fr.energy_at(float(en.times[i])) - en.energies[i]) / en.energies[i] for i in en.front]
    assert min(gaps) >= -REL  # nothing beats the true optimum
    assert max(gaps) <= COVERAGE_BOUND, (case.name, max(gaps))
    # the certified bound holds at every true frontier point
    for i in en.front:
        assert fr.lower_bound_at(float(en.times[i])) <= en.energies[i] * (1 + REL)
