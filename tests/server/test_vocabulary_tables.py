"""The server's open vocabularies come from their one table each.

Plan policies (:data:`perseus.policies.POLICIES`), schedules
(:data:`perseus.schedules.SCHEDULE_NAMES`), NVML's clock-event reason names and the clock bound
(:mod:`perseus_common.clocks`), the profile-error constructor
(:class:`perseus_common.located_error.LocatedError`). A policy or schedule added to its table but not
reaching the API fails here.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient

from perseus.errors import ProfileError
from perseus.policies import POLICIES, POLICY_NAMES
from perseus.schedules import SCHEDULE_NAMES
from perseus_client.gpu.nvml import CLOCK_EVENT_REASONS as CLIENT_REASONS
from perseus_client.gpu.nvml import reason_names
from perseus_common.clocks import CLOCK_EVENT_REASONS, MAX_CLOCK_MHZ
from perseus_common.located_error import LocatedError
from perseus_common.profile_csv import MAX_FREQUENCY_MHZ, ProfileFormatError
from perseus_server.config import Limits
from perseus_server.models.responses import PlanPolicyView
from perseus_server.rest import create_app
from perseus_server.rest.jobs import JobIn, NamedScheduleView, ScheduleIn
from perseus_server.rest.profiles import ProfilingIn
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.clock_verification import KNOWN_REASONS

PUBLIC = {p.name: p for pol in POLICIES.values() for p in pol.parameters if p.public}


def _literal_values(annotation: Any) -> set[str]:
    """Every string a (union of) Literal(s) admits."""
    out: set[str] = set()
    for arg in get_args(annotation):
        if isinstance(arg, str):
            out.add(arg)
        elif get_args(arg):  # a nested Literal or union (a model class has no args)
            out |= _literal_values(arg)
    return out


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    service = PerseusService(SqlStore.open(":memory:"), Limits())
    with TestClient(create_app(service), base_url="http://localhost") as client:
        return dict(client.get("/openapi.json").json())


def test_the_policy_view_names_every_policy_and_option() -> None:
    assert _literal_values(PlanPolicyView.model_fields["kind"].annotation) == set(POLICY_NAMES)
    options = {o.name for pol in POLICIES.values() for o in pol.options if o.public}
    assert options <= set(PlanPolicyView.model_fields)
    assert list(PlanPolicyView.model_fields)[:3] == ["kind", "value", "copies"]


def test_the_schedule_literals_are_the_schedule_names() -> None:
    names = set(SCHEDULE_NAMES)
    assert _literal_values(ScheduleIn.model_fields["name"].annotation) == names | {"custom"}
    assert _literal_values(JobIn.model_fields["schedule"].annotation) == names
    assert _literal_values(NamedScheduleView.model_fields["name"].annotation) == names


def test_openapi_documents_every_policy_parameter_with_its_bounds(openapi: dict[str, Any]) -> None:
    params = {p["name"]: p for p in openapi["paths"]["/jobs/{job_id}/plan"]["get"]["parameters"]}
    assert set(PUBLIC) <= set(params)
    for name, p in PUBLIC.items():
        schema = params[name]["schema"]["anyOf"][0]
        assert params[name]["description"] == p.description
        if p.minimum is not None:
            key = "exclusiveMinimum" if p.exclusive_minimum else "minimum"
            assert schema[key] == p.minimum, name
        if p.maximum is not None:
            assert schema["maximum"] == p.maximum, name
    body = openapi["components"]["schemas"]["PlanSelect"]["properties"]
    assert set(PUBLIC) <= set(body)
    view = openapi["components"]["schemas"]["PlanPolicyView"]["properties"]
    assert set(view["kind"]["enum"]) == set(POLICY_NAMES)


def test_bad_policy_values_are_422_naming_the_field() -> None:
    service = PerseusService(SqlStore.open(":memory:"), Limits())
    with TestClient(create_app(service), base_url="http://localhost") as client:
        job = client.post(
            "/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0}
        ).json()["id"]
        for query, field in [
            ({"eta": -0.1}, "eta"),
            ({"eta": 1.5}, "eta"),
            ({"eta": "nan"}, "eta"),
            ({"max_power": 300}, "max_power"),
            ({"deadline": 1, "eta": 0.5}, "eta"),
            ({"index": 1, "eta": 0.5}, "eta"),
            ({}, "deadline"),
        ]:
            r = client.get(f"/jobs/{job}/plan", params=query)
            assert r.status_code == 422, (query, r.text)
            assert r.json().get("field", "").split(".")[-1] == field, (query, r.json())
        r = client.put(f"/jobs/{job}/plan", json={"eta": 2})
        assert r.status_code == 422 and r.json()["field"].split(".")[-1] == "eta", r.text


def test_one_table_of_reason_names_and_one_clock_bound() -> None:
    assert CLIENT_REASONS is CLOCK_EVENT_REASONS
    assert frozenset(CLOCK_EVENT_REASONS.values()) == KNOWN_REASONS
    assert reason_names(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
    clocks = ProfilingIn.model_json_schema()["properties"]["frequencies"]["anyOf"][0]["items"]
    assert clocks["maximum"] == MAX_CLOCK_MHZ and MAX_FREQUENCY_MHZ is MAX_CLOCK_MHZ


def test_profile_errors_share_one_constructor() -> None:
    core = ProfileError("must be > 0", field="time", row=3)
    shared = ProfileFormatError("must be > 0", field="time", row=3)
    for e in (core, shared):
        assert isinstance(e, LocatedError) and isinstance(e, ValueError)
        assert (str(e), e.detail, e.field, e.row) == (
            "row 3, field 'time': must be > 0",
            "must be > 0",
            "time",
            3,
        )
