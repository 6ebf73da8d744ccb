"""``decisions/planner.py``: the server's stored plan policy and the plan it decides.

Any policy of the registry, its options kept through the store's JSON, described in words, and
resolved or refused as infeasible (so that a job falls back to its fastest plan rather than fail);
with stragglers of different speeds, every other pipeline is slowed to the slowest straggler's time,
whatever order they are held in.
"""

from __future__ import annotations

from itertools import permutations

import pytest

from perseus.errors import InfeasibleError
from perseus.frontier import Frontier
from perseus.policies import POLICY_NAMES
from perseus.profiles import Profile
from perseus.schedules import one_f_one_b
from perseus.solver import solve_frontier
from perseus_server.decisions.planner import PlanPolicy, Straggler, decide, resolve_policy
from perseus_server.domain.states import StragglerSource


@pytest.fixture(scope="module")
def fr(slice_profile) -> Frontier:
    profile: Profile = slice_profile([0, 1], {1410, 1200, 1005, 855})
    return solve_frontier(profile, one_f_one_b(2, 4), 83.64)


def test_a_cost_policy_round_trips_with_its_max_power(fr: Frontier) -> None:
    policy = PlanPolicy("eta", 0.7, options=(("max_power", 400.0),))
    doc = policy.to_json()
    assert doc == {"kind": "eta", "value": 0.7, "max_power": 400.0}
    assert PlanPolicy.from_json(doc) == policy
    assert policy.describe() == "eta 0.7 (max power 400 W)"
    assert resolve_policy(fr, policy) == fr.index_for_cost(0.7, 400.0)


def test_the_old_policy_documents_read_as_before() -> None:
    assert PlanPolicy.from_json({"kind": "power_budget", "value": 900.0, "copies": 4}) == (
        PlanPolicy("power_budget", 900.0, 4)
    )
    assert PlanPolicy("power_budget", 900.0, 4).to_json() == {
        "kind": "power_budget", "value": 900.0, "copies": 4
    }  # fmt: skip
    assert PlanPolicy("deadline", 1.5).to_json() == {"kind": "deadline", "value": 1.5}
    assert PlanPolicy().describe() == "fastest plan (point 0)"
    assert PlanPolicy("deadline", 1.5).describe() == "deadline 1.5 s"
    assert PlanPolicy("energy_budget", 20.0).describe() == "energy budget 20 J"


def test_every_registered_policy_is_a_stored_policy(fr: Frontier) -> None:
    values = {"index": 1, "deadline": float(fr.times[-1]), "slowdown": 0.1,
              "energy_budget": float(fr.energies.max()), "power_budget": 1e6, "eta": 0.5}  # fmt: skip
    assert set(values) == set(POLICY_NAMES)
    for name, value in values.items():
        policy = PlanPolicy(name, value, options=(("max_power", 300.0),) if name == "eta" else ())
        assert 0 <= resolve_policy(fr, PlanPolicy.from_json(policy.to_json())) < len(fr)


@pytest.mark.parametrize(
    ("policy", "field"),
    [(PlanPolicy("eta", 0.5), "max_power"), (PlanPolicy("bogus", 1.0), None),
     (PlanPolicy("index", 10_000), None)],
)  # fmt: skip
def test_an_unresolvable_policy_is_infeasible_and_the_job_falls_back(
    fr: Frontier, policy: PlanPolicy, field: str | None
) -> None:
    with pytest.raises(InfeasibleError) as e:
        resolve_policy(fr, policy)
    assert getattr(e.value, "field", None) == field
    with pytest.raises(InfeasibleError):
        decide(fr, policy, 2)
    assert decide(fr, PlanPolicy(), 2).indices() == [0, 0]


# --- the slowest straggler sets T' ------------------------------------------------------------


@pytest.fixture(scope="module")
def six_clocks(slice_profile) -> Frontier:  # type: ignore[no-untyped-def]
    profile: Profile = slice_profile([0, 1], {1410, 1305, 1200, 1095, 1005, 900})
    return solve_frontier(profile, one_f_one_b(2, 4), 83.64)


def test_others_are_slowed_to_the_slowest_stragglers_time(six_clocks: Frontier) -> None:
    t0 = float(six_clocks.times[0])
    # three straggler times, each of which gives the others a different plan
    times = [t0 * f for f in (1.04, 1.12, 1.25)]
    plans = [six_clocks.index_for_deadline(t, wait=True) for t in times]
    assert len(set(plans)) == 3, plans
    want = plans[-1]
    pipelines = 6
    slow = (1, 3, 4)
    for order in permutations(range(3)):  # every straggler may be the slowest, in any order
        stragglers = {
            p: Straggler(p, times[k], StragglerSource.DETECTED) for p, k in zip(slow, order, strict=True)
        }  # fmt: skip
        slowest = next(p for p, s in stragglers.items() if s.time == times[-1])
        d = decide(six_clocks, PlanPolicy(), pipelines, stragglers)
        for p in range(pipelines):
            plan = d.plans[p]
            if p in slow:
                assert plan.index == 0, (order, p)  # stragglers keep the policy's plan
            else:
                assert plan.index == want, (order, p, plan)
                assert f"straggler pipeline {slowest} " in plan.reason, plan.reason
                assert six_clocks.times[plan.index] <= times[-1]
        assert f"T'={times[-1]:.4g} s" in d.reason, d.reason
    # a reported straggler slower than the detected ones counts the same
    mixed = {
        1: Straggler(1, times[0], StragglerSource.DETECTED),
        2: Straggler(2, times[2], StragglerSource.REPORTED),
        5: Straggler(5, times[1], StragglerSource.DETECTED),
    }
    d = decide(six_clocks, PlanPolicy(), pipelines, mixed)
    assert [d.plans[p].index for p in (0, 3, 4)] == [want] * 3


def test_a_resolved_pipeline_follows_a_slower_straggler_on_its_own_frontier(
    fr: Frontier, six_clocks: Frontier
) -> None:
    """A re-solved pipeline that is not the slowest straggler waits for it like the others.

    It gets the least-energy plan of its own frontier within the slowest's T' (it ran its
    fastest plan, and lost its whole saving, when a noisy slow link was flagged on it while
    another pipeline straggled); when it is the slowest, it runs its fastest plan.
    """
    own = six_clocks  # pipeline 1's re-solved frontier
    t_own = float(own.times[0])
    t_slow = 1.12 * t_own
    want = own.index_for_deadline(t_slow, wait=True)
    assert want > 0
    resolved = {1: (own, "link 0 forward 3.5 ms")}
    slower = {2: Straggler(2, t_slow, StragglerSource.DETECTED)}
    d = decide(fr, PlanPolicy(), 4, slower, resolved=resolved)
    plan = d.plans[1]
    assert plan.own and plan.index == want, plan
    assert "straggler pipeline 2" in plan.reason and f"T'={t_slow:.4g} s" in plan.reason
    assert float(own.times[want]) <= t_slow
    assert d.plans[2].index == 0  # the slowest keeps its plan
    assert d.plans[0].index == fr.index_for_deadline(t_slow, wait=True)
    # the re-solved pipeline is the slowest: its fastest plan, the others follow it
    faster = {2: Straggler(2, 0.9 * t_own, StragglerSource.DETECTED)}
    d = decide(fr, PlanPolicy(), 4, faster, resolved=resolved)
    assert d.plans[1].own and d.plans[1].index == 0
    assert "runs the fastest plan of its re-solved frontier" in d.plans[1].reason
    assert d.plans[0].index == fr.index_for_deadline(t_own, wait=True)
