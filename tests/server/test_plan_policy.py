"""The server's stored plan policy: any policy of the registry, its options kept through the
store's JSON, described in words, and resolved or refused as infeasible (so that a job falls
back to its fastest plan rather than fail)."""

from __future__ import annotations

import pytest

from perseus.errors import InfeasibleError
from perseus.frontier import Frontier
from perseus.policies import POLICY_NAMES
from perseus.profiles import Profile
from perseus.schedules import one_f_one_b
from perseus.solver import solve_frontier
from perseus_server.decisions.planner import PlanPolicy, decide, resolve_policy


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
