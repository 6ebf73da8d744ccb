"""``rest/plan_fast_path.py``: a plan query answered ahead, still with every check of the gate.

A plan query is answered ahead of the framework's outer middleware (``PlanQueriesFirst``) and, once
asked, from its kept bytes (``PlanAnswerFront``): on a real ``perseus serve``, every check of the
gate still applies to such an answer: the bearer credential, its scope, the job's tenant (another
tenant's job answers 404 exactly as an unknown one), an open server's allowed hosts; and each
request is counted under the plan route's label.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from perseus_server import ServerProcess
from perseus_server.rest.plan_fast_path import plan_job

from ..conftest import problem_field, sliced_profile_csv, wait_frontier

ADMIN = "front-door-admin"
QUERY = {"slowdown": 0.05}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("front") / "perseus.db", token=ADMIN) as s:
        yield s


def _credentials(admin: httpx.Client, tenant: str) -> dict[str, str]:
    assert admin.post("/tenants", json={"id": tenant}).status_code == 201
    out = {}
    for scope in ("tenant", "tenant-read"):
        r = admin.post("/credentials", json={"scope": scope, "tenant": tenant})
        assert r.status_code == 201, r.text
        out[scope] = r.json()["credential"]
    return out


def _solved(client: httpx.Client) -> str:
    r = client.post("/jobs", json={"stages": 2, "microbatches": 4, "blocking_power": 70.0})
    assert r.status_code == 201, r.text
    job = str(r.json()["id"])
    csv = sliced_profile_csv()
    r = client.put(f"/jobs/{job}/profile", content=csv, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text
    assert client.post(f"/jobs/{job}/frontier").status_code == 202
    assert wait_frontier(client, job)["status"] == "done"
    return job


def _plan_requests(metrics: str, status: str) -> float:
    """``perseus_requests_total`` of the plan route's GETs with ``status``."""
    total = 0.0
    for line in metrics.splitlines():
        labels = ('route="/jobs/{job_id}/plan"', 'method="GET"', f'status="{status}"')
        if line.startswith("perseus_requests_total{") and all(x in line for x in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_kept_answer_is_given_only_to_whom_the_gate_lets_in(srv: ServerProcess) -> None:
    url = srv.http_url
    with httpx.Client(base_url=url, headers=_bearer(ADMIN), timeout=60) as admin:
        a, b = _credentials(admin, "front-a"), _credentials(admin, "front-b")
        with (
            httpx.Client(base_url=url, headers=_bearer(a["tenant"]), timeout=60) as ta,
            httpx.Client(base_url=url, headers=_bearer(a["tenant-read"]), timeout=60) as ra,
            httpx.Client(base_url=url, headers=_bearer(b["tenant"]), timeout=60) as tb,
            httpx.Client(base_url=url, headers=_bearer(b["tenant-read"]), timeout=60) as rb,
            httpx.Client(base_url=url, timeout=60) as anonymous,
        ):
            job = _solved(ta)
            path = f"/jobs/{job}/plan"
            before = admin.get("/metrics").text
            first = ta.get(path, params=QUERY)
            assert first.status_code == 200, first.text
            # The same query again, by every credential that may read the job: the kept bytes.
            for client in (ta, ra, admin):
                again = client.get(path, params=QUERY)
                assert again.status_code == 200 and again.content == first.content
            # No credential, or a wrong one: 401 naming the header, with the challenge.
            for r in (
                anonymous.get(path, params=QUERY),
                anonymous.get(path, params=QUERY, headers=_bearer("not-a-credential")),
            ):
                assert r.status_code == 401, r.text
                assert problem_field(r) == "Authorization"
                assert r.headers["www-authenticate"] == "Bearer"
                assert b'"frequencies"' not in r.content
            # Another tenant's credentials: 404, the same answer as an unknown job's.
            unknown = tb.get("/jobs/" + "0" * 16 + "/plan", params=QUERY)
            for client in (tb, rb):
                r = client.get(path, params=QUERY)
                assert r.status_code == unknown.status_code == 404, r.text
                assert r.json()["detail"].replace(job, "0" * 16) == unknown.json()["detail"]
                assert problem_field(r) == "job_id"
            # Every one of them counted under the plan route's label.
            after = admin.get("/metrics").text
            assert _plan_requests(after, "200") - _plan_requests(before, "200") == 4
            assert _plan_requests(after, "401") - _plan_requests(before, "401") == 2
            assert _plan_requests(after, "404") - _plan_requests(before, "404") == 3


def test_an_open_server_gives_a_kept_answer_only_to_its_hosts(
    http: httpx.Client, small_csv: str
) -> None:
    job = _solved(http)
    path = f"/jobs/{job}/plan"
    first = http.get(path, params=QUERY)
    assert first.status_code == 200 and http.get(path, params=QUERY).content == first.content
    # DNS rebinding: a foreign Host is refused, the answer kept or not.
    for query in (QUERY, {"slowdown": 0.07}):
        r = http.get(path, params=query, headers={"Host": "attacker.example"})
        assert r.status_code == 403 and problem_field(r) == "Host", r.text
    # A HEAD and a POST take the whole stack (the route's own answers).
    assert http.head(path, params=QUERY).status_code in (200, 405)
    assert http.post(path, params=QUERY).status_code == 405


@pytest.mark.parametrize(
    ("path", "job"),
    [
        ("/jobs/abc123/plan", "abc123"),
        ("/jobs//plan", None),
        ("/jobs/a/b/plan", None),  # a job id has no slash: another route
        ("/jobs/abc123/plans", None),
        ("/jobs/abc123/plan/", None),
        ("/v1/jobs/abc123/plan", None),
    ],
)
def test_only_a_plan_paths_job_takes_the_fast_path(path: str, job: str | None) -> None:
    assert plan_job(path) == job
