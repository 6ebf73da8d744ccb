"""A bounded schemathesis run over the server's own OpenAPI schema: no request gets a 5xx.

Driven with hypothesis directly (schemathesis' pytest plugin does not support this pytest).
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from perseus_server import ServerProcess

from .conftest import solved_job

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 4


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
