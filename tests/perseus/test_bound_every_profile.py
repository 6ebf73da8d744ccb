"""The certified bound is a bound for every communication profile the parser accepts.

Transfers drawing less than the blocking power (a negative excess energy), more, or exactly it;
fixed or per-clock times (clocks the producer does not have included); phases; 1F1B and interleaved,
profiles per model stage or per rank. Every plan of the problem (all of them when there are few,
else a random sample plus the frontier's own) is evaluated on the truth, and no bound the frontier
reports exceeds it: not a point's ``lower_bound``, not ``lower_bound_at`` at the plan's time, and
not any point's bound at a later deadline once the plan pays the blocking power until then.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perseus.cli import main as cli_main
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import InstructionProfile, Profile, load_profile
from perseus.schedules import Schedule, interleaved_1f1b, one_f_one_b
from perseus.solver import solve_problem
from perseus_common.communication import Communication, Phase, Transfer

P_BLOCK = 83.64
CLOCKS = np.array([1410, 1200, 1005], dtype=np.int64)

#: The issue's two-stage profile: per-clock transfers drawing 25 W, below the blocking power.
ISSUE_CSV = """stage,instruction,frequency,time,energy
0,forward,1410,0.050,24.0
0,forward,1005,0.065,19.0
0,backward,1410,0.100,46.0
0,backward,1005,0.130,38.0
1,forward,1410,0.050,24.0
1,forward,1005,0.065,19.0
1,backward,1410,0.100,46.0
1,backward,1005,0.130,38.0
0,transfer_forward,1410,0.010,0.25
0,transfer_forward,1005,0.030,0.75
0,transfer_backward,1410,0.010,0.25
0,transfer_backward,1005,0.030,0.75
"""


def all_plans(problem: EnergyProblem, rng: np.random.Generator, cap: int = 4096) -> np.ndarray:
    """Every plan when there are at most ``cap``, else ``cap`` random ones (with the extremes)."""
    num = problem.num_options.astype(np.int64)
    total = int(np.prod(num.astype(float)))
    if total <= cap:
        grids = np.meshgrid(*[np.arange(k) for k in num], indexing="ij")
        return np.stack([g.ravel() for g in grids], axis=1).astype(np.uint8)
    plans = (rng.random((cap, len(num))) * num[None, :]).astype(np.uint8)
    plans[0] = 0
    plans[1] = num - 1
    return plans


def assert_bound_below_every_plan(
    problem: EnergyProblem, frontier: Frontier, plans: np.ndarray
) -> None:
    t, e = problem.evaluate_many(np.vstack([plans, frontier.plans]))
    pr = problem.blocking_power * problem.dag.num_ranks
    tol = 1e-9 * max(float(e.max()), 1.0)
    assert np.all(frontier.lower_bounds <= frontier.energies + tol), (
        frontier.lower_bounds - frontier.energies
    )
    for ti, ei in zip(t.tolist(), e.tolist(), strict=True):
        assert frontier.lower_bound_at(ti) <= ei + tol, (ti, ei, frontier.lower_bound_at(ti))
        later = frontier.times >= ti
        # a plan finishing before a point's time pays the blocking power until then
        paid = ei + pr * (frontier.times[later] - ti)
        assert np.all(frontier.lower_bounds[later] <= paid + tol)


def compute_profile(
    stages: int, rng: np.random.Generator
) -> dict[tuple[int, str], InstructionProfile]:
    out = {}
    for s in range(stages):
        for kind, base in (("forward", 0.05), ("backward", 0.1)):
            t = base * rng.uniform(0.8, 1.2) * (CLOCKS[0] / CLOCKS) ** rng.uniform(0.3, 0.9)
            power = 400 * (CLOCKS / CLOCKS[0]) ** rng.uniform(1.2, 2.5)
            out[(s, kind)] = InstructionProfile(CLOCKS, t, power * t)
    return out


def communication(boundaries: int, stages: int, draw: st.DrawFn) -> Communication:
    transfers = {}
    for b in range(boundaries):
        for d in ("forward", "backward"):
            kind = draw(st.sampled_from(["none", "fixed", "clocked", "clocked-partial"]))
            if kind == "none":
                continue
            t = draw(st.floats(0.001, 0.05))
            power = draw(st.one_of(st.none(), st.floats(0.0, 2.5 * P_BLOCK)))
            by = None
            if kind != "fixed":
                grow = draw(st.lists(st.floats(0.5, 4.0), min_size=3, max_size=3))
                clocks = CLOCKS.tolist() if kind == "clocked" else [1410, 1100]  # 1100: nearest
                by = {c: t * (grow[i] if i else 1.0) for i, c in enumerate(clocks)}
            transfers[(b, d)] = Transfer(t, power, by)
    phases = {}
    for s in range(stages):
        if draw(st.booleans()):
            energy = draw(st.one_of(st.none(), st.floats(0.0, 10.0)))
            phases[s] = (Phase("optimizer", draw(st.floats(0.0, 0.05)), energy),)
    return Communication(transfers, phases)


@st.composite
def problems(draw: st.DrawFn) -> tuple[EnergyProblem, int]:
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    shape = draw(st.sampled_from(["1f1b", "interleaved-rank", "interleaved-model"]))
    schedule: Schedule
    if shape == "1f1b":
        schedule = one_f_one_b(draw(st.integers(2, 3)), draw(st.integers(1, 3)))
        pstages = schedule.stages
    else:
        schedule = interleaved_1f1b(2, 2, 2)
        pstages = schedule.ranks if shape == "interleaved-rank" else schedule.stages
    comm = communication(pstages - 1, pstages, draw)
    profile = Profile(compute_profile(pstages, rng), comm)
    return EnergyProblem.build(profile, schedule, P_BLOCK), seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_no_reported_bound_exceeds_any_plans_true_energy(case: tuple[EnergyProblem, int]) -> None:
    problem, seed = case
    frontier = solve_problem(problem)
    assert_bound_below_every_plan(
        problem, frontier, all_plans(problem, np.random.default_rng(seed))
    )


def test_the_issues_profile_bounds_every_plan(tmp_path: Path) -> None:
    """Per-clock transfers at 25 W.

    The bound once charged the shortest transfer's cost, above the truth's (the longer transfer
    idles less at the blocking power), and 5 of 9 points reported ``lower_bound > energy``.
    """
    path = tmp_path / "x.csv"
    path.write_text(ISSUE_CSV)
    problem = EnergyProblem.build(load_profile(path), one_f_one_b(2, 2), P_BLOCK)
    frontier = solve_problem(problem)
    assert_bound_below_every_plan(problem, frontier, all_plans(problem, np.random.default_rng(0)))
    # the bound is exact where the relaxation is: the all-max-clock plan is optimal at T0
    assert np.isclose(frontier.lower_bounds[0], frontier.energies[0], rtol=1e-9)
    out = tmp_path / "f.json"
    assert cli_main([
        "frontier", str(path), "--stages", "2", "--microbatches", "2",
        "--blocking-power", str(P_BLOCK), "--plans", "-o", str(out),
    ]) == 0  # fmt: skip
    points = json.loads(out.read_text())["points"]
    assert len(points) > 1
    assert all(p["lower_bound"] <= p["energy"] * (1 + 1e-12) for p in points)
