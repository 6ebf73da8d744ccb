"""Frontier queries (deadline, slowdown, energy budget), thinning and the JSON forms."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perseus.errors import InfeasibleError
from perseus.frontier import Frontier, FrontierPoint, plan_json
from perseus.plan_codec import decode_rank_plans
from perseus.profiles import Profile
from perseus.schedules import make_schedule, one_f_one_b
from perseus.solver import solve_frontier
from perseus_common.wire.values import PlanStep

P_A100 = 83.64


@pytest.fixture(scope="module")
def fr(a100: Profile) -> Frontier:
    """The real A100 profile, 8 stages x 4 microbatches, 1F1B: hundreds of points."""
    return solve_frontier(a100, one_f_one_b(8, 4), P_A100)


@pytest.fixture(scope="module")
def small(slice_profile) -> Frontier:
    """Interleaved 1F1B, 2 ranks x 2 chunks, on a 2-stage per-rank profile."""
    profile = slice_profile([0, 1], {1410, 1200, 1005, 855})
    return solve_frontier(profile, make_schedule("interleaved-1f1b", 2, 2, 2), P_A100)


def deadlines(fr: Frontier) -> np.ndarray:
    t = fr.times
    return np.concatenate(
        [
            [t[0], fr.max_frequency_time, fr.max_frequency_time * 1.05, t[-1], t[-1] * 2],
            t[:: max(1, len(t) // 15)],
            (t[:-1:20] + t[1::20]) / 2,  # between points
        ]
    )


def test_fixture_is_a_real_frontier(fr: Frontier) -> None:
    assert len(fr) > 100
    assert fr.min_energy_index < len(fr) - 1  # slower points after the least-energy one exist
    assert fr.times[0] <= fr.max_frequency_time


def test_index_for_deadline_without_waiting_is_least_energy_in_time(fr: Frontier) -> None:
    for T in deadlines(fr):
        i = fr.index_for_deadline(float(T))
        ok = np.flatnonzero(fr.times <= T)
        assert fr.times[i] <= T
        assert fr.energies[i] == fr.energies[ok].min()
    assert fr.index_for_deadline(float(fr.times[-1]) * 10) == fr.min_energy_index


def test_index_for_deadline_with_waiting_counts_blocking_power(fr: Frontier) -> None:
    pr = P_A100 * 8
    for T in deadlines(fr):
        i = fr.index_for_deadline(float(T), wait=True)
        ok = np.flatnonzero(fr.times <= T)
        total = fr.energies[ok] + pr * (T - fr.times[ok])
        assert fr.times[i] <= T
        assert fr.energies[i] + pr * (T - fr.times[i]) == pytest.approx(total.min(), rel=1e-12)
        assert fr.energy_at(float(T)) == pytest.approx(total.min(), rel=1e-12)
    # energy - P R time strictly decreases, so at its own time each point is the best choice
    for k in range(len(fr)):
        assert fr.index_for_deadline(float(fr.times[k]), wait=True) == k
    assert fr.index_for_deadline(float(fr.times[-1]) * 10, wait=True) == len(fr) - 1


@pytest.mark.parametrize("wait", [False, True])
def test_deadline_too_short_or_not_a_number(fr: Frontier, wait: bool) -> None:
    with pytest.raises(InfeasibleError, match="fastest plan takes"):
        fr.index_for_deadline(float(fr.times[0]) * 0.999, wait=wait)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InfeasibleError, match="finite"):
            fr.index_for_deadline(bad, wait=wait)


def test_index_for_slowdown(fr: Frontier) -> None:
    t0, e0 = fr.max_frequency_time, fr.max_frequency_energy
    for s in (0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 10.0):
        i = fr.index_for_slowdown(s)
        assert i == fr.index_for_deadline(t0 * (1 + s))
        assert fr.times[i] <= t0 * (1 + s) * (1 + 1e-12)
    zero = fr.index_for_slowdown(0.0)
    assert fr.energies[zero] < e0  # saves energy with no slowdown at all
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(InfeasibleError, match="slowdown"):
            fr.index_for_slowdown(bad)


def test_index_for_energy_budget_is_the_fastest_plan_within_it(fr: Frontier) -> None:
    for budget in np.linspace(fr.energies.min(), fr.energies.max(), 13):
        i = fr.index_for_energy_budget(float(budget))
        assert fr.energies[i] <= budget
        assert not np.any(fr.energies[:i] <= budget)
    assert fr.index_for_energy_budget(float(fr.energies.max()) + 1) == 0
    assert fr.index_for_energy_budget(float(fr.energies.min())) == fr.min_energy_index
    for bad in (float(fr.energies.min()) - 1e-6, float("nan"), 0.0, -5.0):
        with pytest.raises(InfeasibleError, match="no plan uses at most"):
            fr.index_for_energy_budget(bad)


def test_energy_budget_error_names_the_least_energy(fr: Frontier) -> None:
    least = float(fr.energies.min())
    with pytest.raises(InfeasibleError, match=f"least-energy plan uses {least:.6g} J"):
        fr.index_for_energy_budget(least * 0.9)


def test_thinned_keeps_ends_and_spacing(fr: Frontier) -> None:
    span = float(fr.times[-1] - fr.times[0])
    for res in (span / 200, span / 20, span / 3):
        th = fr.thinned(res)
        assert 2 <= len(th) < len(fr)
        assert th.times[0] == fr.times[0] and th.times[-1] == fr.times[-1]
        assert np.all(np.diff(th.times) >= res)
        # every kept point is an original one, whole
        idx = np.searchsorted(fr.times, th.times)
        np.testing.assert_array_equal(fr.times[idx], th.times)
        np.testing.assert_array_equal(fr.energies[idx], th.energies)
        np.testing.assert_array_equal(fr.lower_bounds[idx], th.lower_bounds)
        np.testing.assert_array_equal(fr.plans[idx], th.plans)
        # and nothing was dropped that could have been kept: each dropped point is within
        # res of the kept point before it or of the last point
        kept = set(idx.tolist())
        for i in range(len(fr)):
            if i not in kept:
                prev = th.times[th.times < fr.times[i]][-1]
                assert fr.times[i] - prev < res or fr.times[-1] - fr.times[i] < res
    assert len(fr.thinned(span * 2)) == 2
    assert fr.thinned(0.0) is fr
    assert len(fr.thinned(1e-12)) == len(fr)


def test_points_and_gap(fr: Frontier) -> None:
    pts = fr.points
    assert len(pts) == len(fr)
    assert pts[3] == FrontierPoint(
        float(fr.times[3]), float(fr.energies[3]), float(fr.lower_bounds[3])
    )
    assert pts[3].gap == pytest.approx(fr.energies[3] / fr.lower_bounds[3] - 1)
    assert all(p.gap >= -1e-9 for p in pts)


@pytest.mark.parametrize("which", ["fr", "small"])
def test_json_with_plans_has_the_cli_shape(which: str, request: pytest.FixtureRequest) -> None:
    f: Frontier = request.getfixturevalue(which)
    doc = json.loads(json.dumps(f.to_json(plans=True)))
    sched = f.schedule
    assert {
        "schedule",
        "stages",
        "microbatches",
        "blocking_power",
        "max_frequency_time",
        "max_frequency_energy",
        "points",
    } <= set(doc)
    assert "encoded" not in doc
    assert doc["schedule"] == sched.name
    assert doc["stages"] == sched.ranks and doc["microbatches"] == sched.microbatches
    assert doc["blocking_power"] == P_A100
    assert doc["max_frequency_time"] == f.max_frequency_time
    assert doc["max_frequency_energy"] == f.max_frequency_energy
    assert len(doc["points"]) == len(f)
    times = [p["time"] for p in doc["points"]]
    assert times == sorted(times) and times == f.times.tolist()
    plans = list(decode_rank_plans(doc))  # each point's "plan", in the compact per-rank form
    for i in (0, len(f) // 2, len(f) - 1):
        pt = doc["points"][i]
        assert set(pt) == {"time", "energy", "lower_bound", "plan"}
        assert (pt["energy"], pt["lower_bound"]) == (f.energies[i], f.lower_bounds[i])
        plan = plans[i]
        assert len(plan) == sched.ranks
        freqs = f.frequencies(i).tolist()
        k = 0
        for rank, order in zip(plan, sched.orders, strict=True):
            assert len(rank) == len(order)
            for step, op in zip(rank, order, strict=True):
                assert step == {
                    "instruction": op.kind,
                    "microbatch": op.microbatch,
                    "stage": op.stage,
                    "frequency": freqs[k],
                }
                k += 1
    plain = f.to_json()
    assert all(set(p) == {"time", "energy", "lower_bound"} for p in plain["points"])


@pytest.mark.parametrize("which", ["fr", "small"])
def test_compact_json_round_trip_is_exact(which: str, request: pytest.FixtureRequest) -> None:
    f: Frontier = request.getfixturevalue(which)
    doc = f.to_json(compact=True)
    back = Frontier.from_json(json.loads(json.dumps(doc)))
    assert back.schedule == f.schedule
    assert back.blocking_power == f.blocking_power
    assert back.max_frequency_time == f.max_frequency_time
    assert back.max_frequency_energy == f.max_frequency_energy
    for name in (
        "times",
        "energies",
        "lower_bounds",
        "plans",
        "node_freqs",
        "bound_times",
        "bound_energies",
    ):
        a, b = getattr(f, name), getattr(back, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    for i in range(0, len(f), max(1, len(f) // 7)):
        assert back.plan_steps(i) == f.plan_steps(i)
    for T in deadlines(f)[:8]:
        assert back.lower_bound_at(float(T)) == f.lower_bound_at(float(T))
        assert back.index_for_deadline(float(T), wait=True) == f.index_for_deadline(
            float(T), wait=True
        )
    assert back.to_json(compact=True) == doc


def test_plan_steps_name_model_stages(small: Frontier) -> None:
    steps = small.plan_steps(0)
    assert [s["stage"] for s in steps[0]] == [op.stage for op in small.schedule.orders[0]]
    assert {s["stage"] for s in steps[1]} == {1, 3}
    # the fastest plan is as fast as running everything at 1410 MHz, but slows off-critical ops
    assert small.times[0] == pytest.approx(small.max_frequency_time, rel=1e-12)
    assert {s["frequency"] for rank in steps for s in rank} <= {1410, 1200, 1005, 855}
    assert small.energies[0] < small.max_frequency_energy


def test_plan_is_the_wire_steps_the_ranks_run(small: Frontier) -> None:
    """``plan(i)``: per rank, the wire's steps in execution order at point ``i``'s clocks."""
    for i in (0, len(small) // 2, len(small) - 1):
        plan = small.plan(i)
        assert all(type(s) is PlanStep for rank in plan for s in rank)
        assert [[(s.instruction, s.microbatch, s.stage) for s in rank] for rank in plan] == [
            [(op.kind, op.microbatch, op.stage) for op in order] for order in small.schedule.orders
        ]
        clocks = [s.frequency_mhz for rank in plan for s in rank]
        assert clocks == small.frequencies(i).tolist()
        assert small.plan_steps(i) == plan_json(plan)
        assert plan_json(plan)[0][0] == {
            "instruction": plan[0][0].instruction,
            "microbatch": plan[0][0].microbatch,
            "stage": plan[0][0].stage,
            "frequency": plan[0][0].frequency_mhz,
        }
