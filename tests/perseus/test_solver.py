"""The frontier solver: exactness, its lower bound, property tests, progress and cancellation.

Exactness against brute force on tiny instances, its lower bound against an independent LP, property
tests on random profiles and schedules, progress and cancellation.

Plans are re-evaluated here by :func:`simulate`, a plain event simulation of the schedule that
shares no code with :mod:`perseus.dag`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lp_reference import LPRelaxation

from perseus.errors import OptionError, SolverCancelled
from perseus.frontier import Frontier
from perseus.kernels import repair
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, load_profile, parse_profile_csv, parse_profile_json
from perseus.schedules import Op, Schedule, make_schedule, one_f_one_b
from perseus.solver import (
    Relaxation,
    Rounder,
    SolverOptions,
    relaxed_frontier,
    solve_frontier,
    solve_problem,
)

P_A100 = 83.64
A100_CSV = Path(__file__).resolve().parents[2] / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
A40_CSV = A100_CSV.with_name("gpt3-175b_a40_8stage.csv")
P_A40 = 70.38
REL = 1e-9


# --- an independent evaluator ---------------------------------------------------------------


def simulate(
    profile: Profile, schedule: Schedule, power: float, freq: Callable[[Op], int]
) -> tuple[float, float]:
    """(iteration time, energy) of running every op at ``freq(op)`` MHz.

    Each rank runs its ops in order; an op starts once the previous op on its rank and its data
    dependency (the previous stage's forward, the next stage's backward, or for the last stage
    its own forward) have finished. A profile with one entry per rank is split evenly over the
    rank's model chunks. Raises ``KeyError`` for a frequency the profile lacks.
    """
    per_model = profile.stages == schedule.stages
    scale = 1.0 if per_model else 1.0 / schedule.virtual_stages
    rank_of = {op.stage: r for r, order in enumerate(schedule.orders) for op in order}
    last = schedule.stages - 1

    def cost(op: Op) -> tuple[float, float]:
        entry = profile[(op.stage if per_model else rank_of[op.stage], op.kind)]
        j = entry.frequencies.tolist().index(freq(op))  # ValueError if not measured
        return float(entry.times[j]) * scale, float(entry.energies[j]) * scale

    def dependency(op: Op) -> Op | None:
        if op.kind == "forward":
            return Op("forward", op.microbatch, op.stage - 1) if op.stage > 0 else None
        if op.stage < last:
            return Op("backward", op.microbatch, op.stage + 1)
        return Op("forward", op.microbatch, op.stage)

    finish: dict[Op, float] = {}
    free = [0.0] * schedule.ranks
    pos = [0] * schedule.ranks
    busy = energy = 0.0
    while any(p < len(o) for p, o in zip(pos, schedule.orders, strict=True)):
        moved = False
        for r, order in enumerate(schedule.orders):
            while pos[r] < len(order):
                op = order[pos[r]]
                dep = dependency(op)
                if dep is not None and dep not in finish:
                    break
                t, e = cost(op)
                start = max(free[r], finish[dep] if dep is not None else 0.0)
                finish[op] = free[r] = start + t
                busy += t
                energy += e
                pos[r] += 1
                moved = True
        assert moved, "deadlock"
    T = max(finish.values())
    return T, energy + power * (schedule.ranks * T - busy)


def plan_frequencies(frontier: Frontier, i: int) -> dict[Op, int]:
    return {
        Op(s["instruction"], s["microbatch"], s["stage"]): s["frequency"]
        for rank in frontier.plan_steps(i)
        for s in rank
    }


def waiting_energy(frontier: Frontier) -> np.ndarray:
    """``energy - P R time``: the quantity the frontier is Pareto-optimal in (with time)."""
    return frontier.energies - frontier.blocking_power * frontier.schedule.ranks * frontier.times


# --- exactness on tiny instances -------------------------------------------------------------


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


# --- the lower bound against an independent LP ----------------------------------------------


@pytest.mark.parametrize(
    ("stages", "freqs", "microbatches"),
    [
        ([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855}, 4),
        (list(range(8)), None, 4),
    ],
    ids=["sliced-4x4", "a100-8x4"],
)
def test_lower_bound_equals_the_lp_relaxation(
    slice_profile, stages: list[int], freqs: set[int] | None, microbatches: int
) -> None:
    profile = slice_profile(stages, freqs)
    schedule = one_f_one_b(len(stages), microbatches)
    fr = solve_frontier(profile, schedule, P_A100)
    lp = LPRelaxation(EnergyProblem.build(profile, schedule, P_A100))
    assert fr.times[0] == pytest.approx(lp.min_time, rel=REL)
    t0 = fr.max_frequency_time
    deadlines = np.unique(
        np.concatenate(
            [
                np.linspace(fr.times[0], 1.5 * t0, 24),
                fr.times[:: max(1, len(fr) // 6)],  # at some plans' own times
                [lp.cheapest_time],
            ]
        )
    )
    for T in deadlines:
        ref = lp.solve(float(T)).value
        assert fr.lower_bound_at(float(T)) == pytest.approx(ref, rel=1e-6), T
    assert fr.lower_bound_at(fr.times[0] * 0.99) == float("inf")
    np.testing.assert_allclose(
        fr.lower_bounds, [fr.lower_bound_at(float(t)) for t in fr.times], rtol=1e-12
    )
    assert np.all(fr.lower_bounds <= fr.energies * (1 + REL))
    # the bound is tight where it matters: every point within 1 % (the slowest exactly)
    assert np.all(fr.energies <= fr.lower_bounds * 1.01)
    assert fr.energies[-1] == pytest.approx(fr.lower_bounds[-1], rel=REL)


# --- property tests --------------------------------------------------------------------------


@st.composite
def instances(
    draw: st.DrawFn,
    names: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b"),
    max_microbatches: int = 4,
    max_freqs: int = 5,
) -> tuple[Profile, Schedule, float]:
    """A random profile and schedule, and a blocking power.

    The profile has 2-3 stages and 2-5 frequencies, each (stage, kind) measuring a subset, time
    increasing as the frequency drops, 30-400 W.
    """
    name = draw(st.sampled_from(names))
    ranks = draw(st.integers(2, 3))
    if name == "interleaved-1f1b":
        virtual = 2
        microbatches = ranks * draw(st.integers(1, 4 // ranks))
        profile_stages = draw(st.sampled_from([ranks, ranks * virtual]))
    else:
        virtual = 1
        microbatches = draw(st.integers(1, max_microbatches))
        profile_stages = ranks
    schedule = make_schedule(name, ranks, microbatches, virtual)
    nfreq = draw(st.integers(2, max_freqs))
    freqs = draw(st.lists(st.integers(200, 2000), min_size=nfreq, max_size=nfreq, unique=True))
    positive = st.floats(0.001, 0.05, allow_nan=False)
    records = []
    for s in range(profile_stages):
        for kind in ("forward", "backward"):
            # each (stage, kind) measures a non-empty subset of the frequencies
            mine = sorted(
                draw(st.lists(st.sampled_from(freqs), min_size=1, max_size=nfreq, unique=True)),
                reverse=True,
            )
            t = draw(st.floats(0.005, 0.1))
            for j, f in enumerate(mine):
                if j:
                    t += draw(positive)  # slower at a lower frequency
                watts = draw(st.floats(30.0, 400.0))
                records.append(
                    {
                        "stage": s,
                        "instruction": kind,
                        "frequency": f,
                        "time": t,
                        "energy": t * watts,
                    }
                )
    power = draw(st.floats(0.0, 250.0))
    return parse_profile_json({"records": records}), schedule, power


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_frontier_properties(instance: tuple[Profile, Schedule, float]) -> None:
    profile, schedule, power = instance
    fr = solve_frontier(profile, schedule, power)
    problem = EnergyProblem.build(profile, schedule, power)
    assert len(fr) >= 1
    assert fr.plans.dtype == np.uint8 and fr.plans.shape == (len(fr), schedule.num_instructions)
    assert np.all(np.diff(fr.times) > 0)
    assert np.all(np.diff(waiting_energy(fr)) < 0)
    # (energy is *not* always non-increasing up to min_energy_index: see
    # test_energy_decreases_up_to_the_least_energy_plan)
    per_model = profile.stages == schedule.stages
    rank_of = schedule.stage_rank()
    for i in range(len(fr)):
        ev = problem.evaluate(fr.plans[i])
        assert ev.time == pytest.approx(fr.times[i], rel=REL)
        assert ev.energy == pytest.approx(fr.energies[i], rel=REL)
        freq = plan_frequencies(fr, i)
        assert len(freq) == schedule.num_instructions
        for op, f in freq.items():
            entry = profile[(op.stage if per_model else rank_of[op.stage], op.kind)]
            assert f in entry.frequencies.tolist()
        t, e = simulate(profile, schedule, power, freq.__getitem__)
        assert t == pytest.approx(fr.times[i], rel=REL)
        assert e == pytest.approx(fr.energies[i], rel=REL)
    assert np.all(fr.lower_bounds <= fr.energies * (1 + REL))
    assert np.all(np.isfinite(fr.lower_bounds))

    def max_frequency(op: Op) -> int:
        return profile[(op.stage if per_model else rank_of[op.stage], op.kind)].max_frequency

    t0, e0 = simulate(profile, schedule, power, max_frequency)
    assert fr.max_frequency_time == pytest.approx(t0, rel=REL)
    assert fr.max_frequency_energy == pytest.approx(e0, rel=REL)
    assert fr.times[0] <= t0 * (1 + REL)
    # nothing at least as fast as T0 beats the all-max-frequency plan waiting until T0
    i0 = fr.index_for_deadline(t0, wait=True)
    assert fr.energy_at(t0) <= e0 * (1 + REL)
    assert fr.times[i0] <= t0 * (1 + REL)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_lower_bound_matches_the_lp_on_random_instances(
    instance: tuple[Profile, Schedule, float],
) -> None:
    profile, schedule, power = instance
    fr = solve_frontier(profile, schedule, power)
    lp = LPRelaxation(EnergyProblem.build(profile, schedule, power))
    for T in np.linspace(fr.times[0], max(fr.times[-1], lp.cheapest_time) * 1.1, 6):
        assert fr.lower_bound_at(float(T)) == pytest.approx(
            lp.solve(float(T)).value, rel=1e-6, abs=1e-9
        )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(names=("gpipe", "1f1b"), max_microbatches=2, max_freqs=3))
def test_random_tiny_instances_against_brute_force(
    instance: tuple[Profile, Schedule, float],
) -> None:
    """Every plan enumerated (at most 3^12).

    The bound never exceeds a real plan's energy and the ends of the frontier are exact.
    (Coverage between the ends is not bounded on such coarse random profiles: over 300 generated
    instances the worst gap of energy_at(T) to the true optimum was 0 % median, 1.1 % at p90, 16
    % at p99 and 27 % at worst; see test_plan_between_relaxation_breakpoints_is_missed.)
    """
    profile, schedule, power = instance
    problem = EnergyProblem.build(profile, schedule, power)
    plans = np.array(
        list(itertools.product(*[range(int(k)) for k in problem.num_options])), dtype=np.uint8
    )
    times, energies = problem.evaluate_many(plans)
    wait = energies - power * schedule.ranks * times
    fr = solve_frontier(profile, schedule, power)
    fastest = times.min()
    assert fr.times[0] == pytest.approx(fastest, rel=REL)
    fw = waiting_energy(fr)
    scale = np.abs(energies).max()
    assert fw[0] <= wait[times <= fastest * (1 + REL)].min() + REL * scale
    assert fw[-1] == pytest.approx(wait.min(), rel=REL, abs=REL * scale)
    for t in np.unique(times)[:: max(1, len(np.unique(times)) // 25)]:
        ok = times <= t * (1 + REL)
        best = float((wait[ok]).min() + power * schedule.ranks * t)
        assert fr.lower_bound_at(float(t)) <= best + REL * scale
        assert fr.energy_at(float(t)) >= best - REL * scale


#: A 2-stage, 1-microbatch chain (P = 0): stage 0's backward saves 6.2 J for 4.2 ms at 400 MHz,
#: stage 1's forward 2.0 J for 1 ms. The relaxation shortens the cheaper-per-second backward
#: first, so its breakpoints are (0.1927 s, 22.2 J), (0.1937 s, 20.2 J) and (0.1979 s, 14.0 J);
#: the discrete plan with only the backward slowed (0.1969 s, 16.0 J) lies between them.
KNAPSACK_CSV = """stage,instruction,frequency,time,energy
0,forward,1800,0.060,1.8
0,backward,1800,0.0255,8.3
0,backward,400,0.0297,2.1
1,forward,1800,0.0246,2.8
1,forward,400,0.0256,0.8
1,backward,1800,0.0826,9.3
"""


def knapsack_problem() -> EnergyProblem:
    return EnergyProblem.build(parse_profile_csv(KNAPSACK_CSV), one_f_one_b(2, 1), 0.0)


def test_plan_between_breakpoints_is_found_and_its_bound_is_honest() -> None:
    fr = solve_problem(knapsack_problem())
    assert fr.times == pytest.approx([0.1927, 0.1937, 0.1969, 0.1979])
    assert fr.energies == pytest.approx([22.2, 20.2, 16.0, 14.0])
    # the bound between the breakpoints interpolates the relaxation, below the plan
    assert fr.lower_bound_at(0.1969) == pytest.approx(20.2 - 6.2 * 3.2 / 4.2)
    assert fr.lower_bound_at(0.1969) <= fr.energy_at(0.1969) == pytest.approx(16.0)


def test_exchange_swaps_which_node_is_slowed() -> None:
    """An exchange finds the plan that slows another node, where reclaiming cannot.

    From the 0.1937 s plan (stage 1's forward slowed) with 4.1 ms to spare, slowing stage 0's
    backward needs 4.2 ms: reclaiming cannot, an exchange (speed the forward back up) can.
    """
    problem = knapsack_problem()
    rounder = Rounder(problem, Relaxation.build(problem))
    fr = solve_problem(problem)
    start = fr.plans[1][None, :]
    assert problem.evaluate(start[0]).time == pytest.approx(0.1937)
    deadline = np.array([0.1978])
    assert np.array_equal(rounder.reclaim(start, deadline), start)
    swapped = problem.evaluate(rounder.exchange(start, deadline)[0])
    assert swapped.time == pytest.approx(0.1969)
    assert swapped.energy == pytest.approx(16.0)


def test_search_finds_the_plan_only_an_exchange_reaches() -> None:
    """The large-neighbourhood search gets there too, from any seed.

    One of its trials slows stage 0's backward and repairs the overrun by speeding the forward
    back up.
    """
    problem = knapsack_problem()
    rounder = Rounder(problem, Relaxation.build(problem))
    start = solve_problem(problem).plans[1][None, :]
    for seed in range(4):
        found = problem.evaluate(rounder.search(start, np.array([0.1978]), np.array([seed]), 50)[0])
        assert found.time == pytest.approx(0.1969)
        assert found.energy == pytest.approx(16.0)


#: A chain of two instructions: the forward's middle option is a cheap step from its slowest
#: but leaves a costly one to its fastest; the backward has just two options.
CHAIN_CSV = """stage,instruction,frequency,time,energy
0,forward,1000,1.0,10.0
0,forward,900,1.9,5.05
0,forward,800,2.0,5.0
0,backward,1000,1.0,7.0
0,backward,800,2.0,5.0
"""


def test_repair_makes_the_cheapest_speed_up_per_second_that_it_needs() -> None:
    """Both slowest (4 s) overrun a 3 s deadline by 1 s.

    The forward's next faster option costs least per second (0.5 J/s) but covers 0.1 s; taking
    the forward all the way to 1.0 s would cost 5 J/s. The repair takes the cheap step and then
    speeds the backward up (2 J/s): 12.05 J, where taking the forward to its fastest costs 15 J.
    """
    problem = EnergyProblem.build(parse_profile_csv(CHAIN_CSV), make_schedule("gpipe", 1, 1), 0.0)
    rounder = Rounder(problem, Relaxation.build(problem))
    pick = rounder.nopt - 1  # positions in each node's options by time: the slowest
    cur = rounder.times[np.arange(2), pick]
    fits = repair(
        rounder.dag, rounder.times, rounder.costs, 3.0, np.zeros(2, bool), pick, cur, np.empty(2)
    )
    assert fits
    plan = problem.evaluate(rounder.order[np.arange(2), pick])
    assert plan.time == pytest.approx(2.9)
    assert plan.energy == pytest.approx(12.05)


#: What hypothesis shrank the "energy non-increasing up to min_energy_index" property to: a
#: 3-stage GPipe pipeline with one microbatch is a chain of 6 ops; stage 1's forward has a slower
#: option at a higher energy that is cheaper in effective cost at 31 W of blocking power.
RISING_CSV = """stage,instruction,frequency,time,energy
0,forward,200,0.0625,1.875
0,backward,203,0.09375,5.71875
0,backward,202,0.125,3.75
0,backward,201,0.15625,4.6875
0,backward,200,0.1875,5.625
1,forward,201,0.0625,1.875
1,forward,200,0.078125,2.34375
1,backward,200,0.0625,1.875
2,forward,200,0.0625,1.875
2,backward,200,0.0625,1.875
"""


def rising_frontier() -> Frontier:
    return solve_frontier(parse_profile_csv(RISING_CSV), make_schedule("gpipe", 3, 1), 31.0)


def test_a_slower_costlier_plan_is_kept_when_it_beats_waiting() -> None:
    fr = rising_frontier()
    assert fr.times[:3] == pytest.approx([0.40625, 0.421875, 0.4375])
    assert fr.energies[:3] == pytest.approx([40.28125, 41.71875, 40.25])
    # at its own time, point 1 beats point 0 plus waiting (41.734375 J)
    assert fr.index_for_deadline(0.421875, wait=True) == 1
    assert fr.index_for_deadline(0.421875, wait=False) == 0


def test_energy_falls_to_the_least_energy_plan_except_where_waiting_pays() -> None:
    """Before the least-energy plan, a point's energy rises only where waiting pays.

    Before the least-energy plan, a point may only rise in energy over the one before it if it
    beats that one plus waiting (it is on the frontier for that reason alone).
    """
    fr = rising_frontier()
    p, r = fr.blocking_power, fr.schedule.ranks
    for i in range(1, fr.min_energy_index + 1):
        if fr.energies[i] > fr.energies[i - 1]:
            assert fr.energies[i] < fr.energies[i - 1] + p * r * (fr.times[i] - fr.times[i - 1])


# --- rounding, reclaiming and exchanges ------------------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.integers(0, 2**32 - 1))
def test_rounding_reclaim_and_exchange_keep_every_plan_within_its_deadline(
    instance: tuple[Profile, Schedule, float], seed: int
) -> None:
    """Rounding, reclaiming, exchanging and searching keep every plan within its deadline.

    Rounded plans (nearest-vertex and randomised) meet the relaxed optimum's time and use only
    undominated measured options; giving a plan more slack, exchanging or searching never raises
    its energy at the deadline (waiting included) and keeps it within the deadline.
    """
    profile, schedule, power = instance
    problem = EnergyProblem.build(profile, schedule, power)
    rel = Relaxation.build(problem)
    steps = list(relaxed_frontier(problem, rel))
    durations = np.stack([step.durations for step in steps])
    deadlines = np.array([step.time for step in steps])
    rounder = Rounder(problem, rel)
    rng = np.random.default_rng(seed)
    nodes = np.arange(problem.num_nodes)
    pr = power * schedule.ranks
    for up_at in (None, rng.random(durations.shape)):
        plans = rounder.round(durations, deadlines, rng.random(len(steps)) < 0.5, up_at)
        times, energies = problem.evaluate_many(plans)
        assert np.all(times <= deadlines * (1 + 1e-9))
        assert np.all(rel.pareto[nodes, plans])
    later = times * (1 + 0.05 * rng.random(len(times)))
    before = energies + pr * (later - times)
    seeds = rng.integers(0, 2**31, len(plans))
    for better in (
        rounder.reclaim(plans, later),
        rounder.exchange(plans, later),
        rounder.search(plans, later, seeds, 20),
    ):
        t2, e2 = problem.evaluate_many(better)
        assert np.all(t2 <= later * (1 + 1e-9))
        assert np.all(e2 + pr * (later - t2) <= before + 1e-9 * np.abs(before))
        assert np.all(rel.pareto[nodes, better])


@pytest.mark.parametrize(
    "schedule",
    [one_f_one_b(4, 6), make_schedule("interleaved-1f1b", 2, 4, 2), make_schedule("gpipe", 3, 2)],
    ids=["1f1b", "interleaved", "gpipe"],
)
def test_diagonals_follow_each_pass_through_the_stages(slice_profile, schedule: Schedule) -> None:
    """The search's diagonal moves find the node of every (model stage, kind, microbatch).

    Each node exactly once, at its own op's place, and nothing else.
    """
    profile = slice_profile(list(range(schedule.ranks)), {1410, 1200, 990})
    problem = EnergyProblem.build(profile, schedule, P_A100)
    diag = Rounder(problem, Relaxation.build(problem)).diag
    dag = problem.dag
    assert sorted(diag[diag >= 0].tolist()) == list(range(problem.num_nodes))
    assert np.array_equal(diag[dag.stage, dag.kind, dag.microbatch], np.arange(problem.num_nodes))
    assert diag.shape == (schedule.stages, 2, schedule.microbatches)


def test_solve_is_reproducible(slice_profile) -> None:
    """The randomised roundings come from a seeded generator.

    The same input gives the same frontier, plans included.
    """
    profile = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855})
    problem = EnergyProblem.build(profile, one_f_one_b(4, 6), P_A100)
    a, b = (
        solve_problem(problem, SolverOptions(hard_gap=0.0)),
        solve_problem(problem, SolverOptions(hard_gap=0.0)),
    )
    assert np.array_equal(a.times, b.times) and np.array_equal(a.plans, b.plans)


def test_search_improves_the_zero_slowdown_plan_reproducibly() -> None:
    """A40, 8 stages x 8 microbatches (rounding leaves the fastest plan 0.32 % above the bound).

    The default search lowers its energy at the same (no-slowdown) iteration time to within 0.23
    % of the bound (0.18-0.22 % over seeds 0-7; moves of a few options at a time reached 0.25 %:
    the last stage's forwards must jump from 1740 MHz straight to the next hull vertex, 1320),
    more effort lowers it further, and the seeded search gives the same frontier every time.
    """
    problem = EnergyProblem.build(load_profile(A40_CSV), one_f_one_b(8, 8), P_A40)
    plain = solve_problem(problem, SolverOptions(effort=0))
    a, b = solve_problem(problem), solve_problem(problem)
    harder = solve_problem(problem, SolverOptions(effort=3))
    assert a.times[0] <= a.max_frequency_time * (1 + 1e-12)
    assert a.lower_bounds[0] == pytest.approx(plain.lower_bounds[0])
    assert harder.energies[0] <= a.energies[0] < plain.energies[0] - 1.0  # joules, at T0
    assert plain.energies[0] > 1.003 * plain.lower_bounds[0]
    assert a.energies[0] < 1.0023 * a.lower_bounds[0]
    assert np.array_equal(a.plans, b.plans) and np.array_equal(a.energies, b.energies)
    assert problem.evaluate(a.plans[0]).energy == pytest.approx(a.energies[0])
    # the extra rounds find better plans for the worst stretches of the frontier, past T0
    no_rounds = solve_problem(problem, SolverOptions(effort=3, search_intervals=0))
    grid = np.linspace(a.times[0], 1.05 * a.times[0], 400)[1:]
    assert min(harder.energy_at(t) - no_rounds.energy_at(t) for t in grid) < -1.0


def test_diagonal_roundings_lower_the_worst_gap_where_the_a40_mixes_vertices() -> None:
    """A40, 8 stages x 24 microbatches.

    Just past T0 the relaxation runs every rank's backwards between two far-apart hull vertices
    (1335 and 960 MHz). Rounding by whole microbatches (diagonals) finds plans closer to the
    bound there than rounding node by node: the worst gap from T0 to 1.1 T0 falls (0.73 % to
    0.67 % when measured, without the search).
    """
    problem = EnergyProblem.build(load_profile(A40_CSV), one_f_one_b(8, 24), P_A40)
    on = solve_problem(problem, SolverOptions(effort=0))
    off = solve_problem(problem, SolverOptions(effort=0, diagonal_rounding=False))
    t0 = on.max_frequency_time
    grid = np.linspace(t0, 1.1 * t0, 1001)

    def worst(fr: Frontier) -> float:
        return max(fr.energy_at(t) / fr.lower_bound_at(t) - 1 for t in grid)

    assert worst(on) < worst(off) - 3e-4
    for fr in (on, off):
        t, e = problem.evaluate_many(fr.plans)
        assert np.allclose(t, fr.times) and np.allclose(e, fr.energies)


@pytest.mark.parametrize("effort", [-1.0, float("nan"), float("inf")])
def test_bad_effort_is_rejected_by_name(effort: float) -> None:
    with pytest.raises(OptionError, match="effort"):
        solve_problem(knapsack_problem(), SolverOptions(effort=effort))


# --- progress and cancellation ---------------------------------------------------------------


def test_progress_rises_to_one(slice_profile) -> None:
    profile = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855})
    seen: list[float] = []
    fr = solve_frontier(profile, one_f_one_b(4, 4), P_A100, progress=seen.append)
    assert len(fr) > 1
    assert len(set(seen)) >= 5
    assert seen[0] < 0.5
    assert all(0.0 <= f <= 1.0 for f in seen)
    assert all(b >= a for a, b in zip(seen, seen[1:], strict=False))
    assert seen[-1] == 1.0


def test_cancel_raises(slice_profile) -> None:
    profile = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855})
    with pytest.raises(SolverCancelled):
        solve_frontier(profile, one_f_one_b(4, 4), P_A100, cancel=lambda: True)
    calls = []

    def later() -> bool:
        calls.append(1)
        return len(calls) > 3

    seen: list[float] = []
    with pytest.raises(SolverCancelled):
        solve_frontier(profile, one_f_one_b(4, 4), P_A100, progress=seen.append, cancel=later)
    assert len(calls) == 4  # polled until it said yes, not after
    assert 1.0 not in seen
