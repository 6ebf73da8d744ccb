"""The frontier solver end to end (``perseus.solver.solve``): its bound, properties, progress.

Its lower bound against an independent LP, property tests on random profiles and schedules, plans
between breakpoints, reproducible seeded roundings and search, progress and cancellation. The
exactness on tiny instances is ``test_solve_exactness.py``'s; the rounder's and the kernels' own
tests are ``test_rounder.py`` and ``tests/perseus/kernels/``.

Plans are re-evaluated here by :func:`simulate`, a plain event simulation of the schedule that
shares no code with :mod:`perseus.dag`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from lp_reference import LPRelaxation
from solver_instances import instances, knapsack_problem, waiting_energy

from perseus.errors import SolverCancelled
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, load_profile, parse_profile_csv
from perseus.schedules import Op, Schedule, make_schedule, one_f_one_b
from perseus.solver import (
    SolverOptions,
    solve_frontier,
    solve_problem,
)

P_A100 = 83.64
A100_CSV = Path(__file__).resolve().parents[3] / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
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


def test_plan_between_breakpoints_is_found_and_its_bound_is_honest() -> None:
    fr = solve_problem(knapsack_problem())
    assert fr.times == pytest.approx([0.1927, 0.1937, 0.1969, 0.1979])
    assert fr.energies == pytest.approx([22.2, 20.2, 16.0, 14.0])
    # the bound between the breakpoints interpolates the relaxation, below the plan
    assert fr.lower_bound_at(0.1969) == pytest.approx(20.2 - 6.2 * 3.2 / 4.2)
    assert fr.lower_bound_at(0.1969) <= fr.energy_at(0.1969) == pytest.approx(16.0)


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


# --- seeded roundings and search ------------------------------------------------------------------


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
