"""The plan-policy registry.

Each policy's resolver is the frontier query it names, Zeus's cost policy is the brute-force argmin
of its cost, and the CLI and the docs follow the registry.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pytest

from perseus.cli import build_parser
from perseus.errors import InfeasibleError, OptionError
from perseus.frontier import Frontier
from perseus.policies import POLICIES, POLICY_NAMES, chosen, markdown_table, resolve
from perseus.power import index_for_power_budget
from perseus.profiles import Profile
from perseus.schedules import SCHEDULE_NAMES, make_schedule, one_f_one_b
from perseus.solver import solve_frontier
from perseus_common.gpus import KNOWN_GPUS

ROOT = Path(__file__).resolve().parents[2]
P_A100 = 83.64


@pytest.fixture(scope="module")
def fr(slice_profile) -> Frontier:
    """A real frontier: 4 A100 stages, 8 clocks, 1F1B with 4 microbatches."""
    profile: Profile = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1110, 1005, 945, 900, 855})
    return solve_frontier(profile, one_f_one_b(4, 4), P_A100)


def brute_force_cost(fr: Frontier, eta: float, max_power: float) -> int:
    """The point of least ``eta * E + (1 - eta) * max_power * ranks * T``, the first on ties."""
    best, best_cost = -1, math.inf
    for i, p in enumerate(fr.points):
        cost = eta * p.energy + (1 - eta) * max_power * fr.schedule.ranks * p.time
        if cost < best_cost:
            best, best_cost = i, cost
    return best


def test_the_fixture_trades_time_for_energy(fr: Frontier) -> None:
    assert len(fr) > 10 and fr.min_energy_index > 0


@pytest.mark.parametrize("eta", [0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 0.99, 1.0])
@pytest.mark.parametrize("max_power", [400.0, 300.0, 50.0])
def test_index_for_cost_is_the_brute_force_argmin(
    fr: Frontier, eta: float, max_power: float
) -> None:
    assert fr.index_for_cost(eta, max_power) == brute_force_cost(fr, eta, max_power)


def test_cost_ends_are_the_fastest_and_the_least_energy_plan(fr: Frontier) -> None:
    assert fr.index_for_cost(0.0, 400.0) == 0
    assert fr.index_for_cost(1.0, 400.0) == fr.min_energy_index
    # a larger eta never selects a faster plan
    picks = [fr.index_for_cost(e, 400.0) for e in np.linspace(0, 1, 41)]
    assert picks == sorted(picks) and len(set(picks)) > 2


@pytest.mark.parametrize(
    ("eta", "max_power", "field"),
    [(-0.1, 400, "eta"), (1.5, 400, "eta"), (math.nan, 400, "eta"), (0.5, 0, "max_power"),
     (0.5, math.inf, "max_power"), (0.5, -1, "max_power")],
)  # fmt: skip
def test_bad_cost_parameters_name_the_field(
    fr: Frontier, eta: float, max_power: float, field: str
) -> None:
    with pytest.raises(OptionError) as e:
        fr.index_for_cost(eta, max_power)
    assert e.value.field == field


def test_every_resolver_is_the_query_it_names(fr: Frontier) -> None:
    t0 = fr.max_frequency_time
    e_mid = float(np.median(fr.energies))
    watts = float(np.median(fr.energies / fr.times))
    expected = {
        "deadline": (1.1 * t0, {}, fr.index_for_deadline(1.1 * t0)),
        "slowdown": (0.07, {}, fr.index_for_slowdown(0.07)),
        "energy_budget": (e_mid, {}, fr.index_for_energy_budget(e_mid)),
        "power_budget": (
            2 * watts,
            {"copies": 2},
            index_for_power_budget(fr, 2 * watts, pipelines=2),
        ),
        "eta": (0.6, {"max_power": 400.0}, fr.index_for_cost(0.6, 400.0)),
        "index": (3, {}, 3),
    }
    assert set(expected) == set(POLICY_NAMES), "a new policy needs its resolver checked here"
    for name, (value, options, index) in expected.items():
        assert resolve(fr, name, value, options) == index, name


def test_the_cost_policy_without_max_power_names_it(fr: Frontier) -> None:
    with pytest.raises(OptionError) as e:
        resolve(fr, "eta", 0.5, {})
    assert e.value.field == "max_power"


def test_an_index_off_the_frontier_is_infeasible(fr: Frontier) -> None:
    with pytest.raises(InfeasibleError):
        resolve(fr, "index", len(fr), {})


def test_chosen_picks_one_policy_and_checks_its_bounds() -> None:
    assert chosen({n: None for n in POLICY_NAMES}) is None
    assert chosen({"eta": 0.5, "max_power": 300}) == ("eta", 0.5, {"max_power": 300.0})
    assert chosen({"deadline": 2}) == ("deadline", 2.0, {})
    cases = [
        ({"deadline": 1.0, "eta": 0.5}, "eta"),  # two policies: the second is named
        ({"max_power": 300.0}, "max_power"),  # an option without its policy
        ({"deadline": 1.0, "max_power": 300.0}, "max_power"),  # an option of another policy
        ({"eta": 1.5}, "eta"),
        ({"eta": math.nan}, "eta"),
        ({"deadline": 0.0}, "deadline"),
        ({"slowdown": -0.1}, "slowdown"),
        ({"index": 1.5}, "index"),
        ({"eta": 0.5, "max_power": 0.0}, "max_power"),
    ]
    for given, field in cases:
        with pytest.raises(OptionError) as e:
            chosen(given)
        assert e.value.field == field, given


def test_every_parameter_is_documented_with_bounds_and_a_unit() -> None:
    for pol in POLICIES.values():
        assert pol.selects and pol.resolver is not None
        for p in pol.parameters:
            assert p.description and p.unit in ("", "s", "J", "W")
            assert p.minimum is not None, f"{p.name} needs a lower bound"


def _option_dests(parser: argparse.ArgumentParser, command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions}


def test_perseus_frontier_has_an_option_per_policy_parameter_and_every_schedule() -> None:
    options = _option_dests(build_parser(), "frontier")
    for pol in POLICIES.values():
        for p in pol.parameters:
            if p.public:
                assert "--" + p.name.replace("_", "-") in options[p.name].option_strings
    assert tuple(options["schedule"].choices) == SCHEDULE_NAMES


def test_the_docs_policy_table_is_the_registrys() -> None:
    text = (ROOT / "docs" / "server.md").read_text()
    assert markdown_table() in text
    for name in POLICY_NAMES:
        assert re.search(rf"`{name}=", text), name


def test_every_schedule_name_builds() -> None:
    for name in SCHEDULE_NAMES:
        sched = make_schedule(name, 2, 4, 2 if "interleaved" in name else 1)
        assert sched.name == name and sched.ranks == 2


def test_the_known_gpus_have_their_vendor_max_power_limits() -> None:
    assert {g.key: g.max_power_limit for g in KNOWN_GPUS} == {"a100": 400.0, "a40": 300.0}
