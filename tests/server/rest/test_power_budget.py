"""``rest/power_budget.py``: the cluster power budget's routes and request.

The REST app over a service on a real SQLite file, through its ASGI stack: with no budget set
there is nothing to read or remove; a request is refused naming its field before any job is
looked up, and a job without a frontier cannot be covered. The budget's allocation and its
answers with solved jobs are ``tests/server/service/test_power_budget.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from perseus_server.rest.power_budget import PowerBudgetIn

from ..conftest import in_process_app, make_job, problem_field

BUDGET = "/power-budget"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with in_process_app(tmp_path_factory.mktemp("power") / "perseus.db") as client:
        yield client


def test_without_a_budget_there_is_nothing_to_read_or_remove(http: httpx.Client) -> None:
    for r in (http.get(BUDGET), http.delete(BUDGET)):
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"watts": 1e5, "on_infeasible": "drop_everything"}, "on_infeasible"),
        ({"watts": 1e5, "jobs": [""]}, "jobs.0"),
        ({"watts": 1e5, "jobs": ["j" * 201]}, "jobs.0"),
        ({"watts": 1e5, "jobs": ["j"] * 10_001}, "jobs"),
        ({"watts": True}, "watts"),  # not 1 W
        ({"watts": "1e5"}, "watts"),  # a number, not text parsed into one
    ],
)
def test_a_bad_request_names_its_field(
    http: httpx.Client, body: dict[str, object], field: str
) -> None:
    r = http.put(BUDGET, json=body)
    assert r.status_code == 422 and problem_field(r) == field, r.text
    assert http.get(BUDGET).status_code == 404  # nothing set


def test_a_job_without_a_frontier_cannot_be_covered(http: httpx.Client) -> None:
    job = make_job(http)
    r = http.put(BUDGET, json={"watts": 1e5, "jobs": [job]})
    assert r.status_code == 422 and problem_field(r).startswith("jobs"), r.text
    assert http.get(BUDGET).status_code == 404


def test_the_request_defaults_to_throughput_and_the_least_power() -> None:
    body = PowerBudgetIn.model_validate({"watts": 500})
    assert (body.policy, body.jobs, body.on_infeasible) == ("throughput", None, "least_power")
