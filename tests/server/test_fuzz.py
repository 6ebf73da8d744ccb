"""Bounded schemathesis runs over the server's own OpenAPI schema: no request gets a 5xx.

One run per operation (a real, solved job in its path), then a stateful run whose steps follow
the links schemathesis infers from the schema (``POST /jobs`` -> ``/jobs/{job_id}/...`` via the
new job's ``id``; ``POST /credentials`` -> ``DELETE /credentials/{credential_id}``), so the
operations meet the jobs it creates rather than just 404s.

Driven with hypothesis directly (schemathesis' pytest plugin does not support this pytest).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from perseus_server import ServerProcess

from .conftest import solved_job

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 6
#: The stateful run: scenarios, steps per scenario, and a wall-time budget (s) it stays within.
SCENARIOS, STEPS, STATEFUL_BUDGET = 25, 8, 25.0
VALID_JOB = {"stages": 2, "microbatches": 4, "schedule": "1f1b", "blocking_power": 70.38}


def test_no_server_errors(server: ServerProcess, http: httpx.Client, small_csv: str) -> None:
    real_job = solved_job(http, small_csv, data_parallel=2)
    schema = schemathesis.openapi.from_url(
        server.http_url + "/openapi.json", headers=server.headers
    )
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 20
    seen: list[str] = []
    for op in operations:

        @given(case=op.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: schemathesis.Case) -> None:
            if (
                case.path_parameters
                and "job_id" in case.path_parameters
                and case.method.upper() != "DELETE"
            ):
                case.path_parameters["job_id"] = real_job  # a real, solved job, not just 404s
            response = case.call(base_url=server.http_url, headers=server.headers, timeout=30)
            seen.append(case.operation.label)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
            )
            if response.status_code >= 400:
                ctype = response.headers.get("content-type", [""])[0]
                assert ctype.startswith("application/problem+json"), response.text[:200]

        run()
    assert len(set(seen)) == len(operations)
    assert http.get("/healthz").status_code == 200


def _check(case: schemathesis.Case, response: Any) -> None:
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
    )
    if response.status_code >= 400:
        ctype = response.headers.get("content-type", [""])[0]
        assert ctype.startswith("application/problem+json"), response.text[:200]


def test_stateful_links(server: ServerProcess, http: httpx.Client) -> None:
    schema = schemathesis.openapi.from_url(
        server.http_url + "/openapi.json", headers=server.headers
    )
    # Valid inputs only: the point is to reach created jobs (invalid ones are the run above's).
    schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE])
    machine = schema.as_state_machine()
    links = {name for name in dir(machine) if name.startswith("POST_")}
    # The links the scenarios walk: a created job feeds its status and the other job routes.
    assert any("POST_jobs___201" in n and n.endswith("GET_jobs_job_id_status") for n in links)
    assert any("POST_jobs___201" in n and n.endswith("PUT_jobs_job_id_profile") for n in links)
    assert any(n.startswith("POST_credentials___201") for n in links)
    steps: list[str] = []
    started = time.monotonic()

    class Workflow(machine):  # type: ignore[misc, valid-type]
        def before_call(self, case: schemathesis.Case) -> None:
            # The schema leaves the job's sizes unbounded (the limits are the server's
            # settings), so generated jobs are nearly always refused: create a small real one,
            # keeping the generated name, and let the links carry its id on.
            if case.method.upper() == "POST" and case.operation.path == "/jobs":
                name = case.body.get("name") if isinstance(case.body, dict) else None
                case.body = {**VALID_JOB, **({"name": name} if isinstance(name, str) else {})}

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"base_url": server.http_url, "headers": server.headers, "timeout": 30}

        def validate_response(
            self, response: Any, case: schemathesis.Case, *args: Any, **kwargs: Any
        ) -> None:
            steps.append(f"{case.method} {case.operation.path} {response.status_code}")
            _check(case, response)

    Workflow.run(
        settings=settings(
            max_examples=SCENARIOS,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
    )
    assert time.monotonic() - started < STATEFUL_BUDGET * 3  # generous: a bound, not a timing
    # Linked steps reached existing jobs: some call on /jobs/{job_id}/... answered 2xx.
    linked_ok = [s for s in steps if "{job_id}" in s and s.rsplit(" ", 1)[1].startswith("2")]
    assert linked_ok, sorted(set(steps))
    assert http.get("/healthz").status_code == 200
