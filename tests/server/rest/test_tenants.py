"""Tenants on a real ``perseus serve``.

A tenant's credentials see and change only its jobs (listings, status, profiles, metrics, the power
budget, credentials), its quotas hold, the admin alone manages tenants, and a single-tenant
deployment's jobs live in ``default``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from perseus_server import ServerProcess
from perseus_server.config import Limits
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.credentials import Credentials

from ..conftest import problem_field, solved_job

ADMIN = "the-admin-token"
JOB = {"stages": 2, "microbatches": 2, "blocking_power": 70.0}


def exercise_tenants(c: Any) -> None:
    """Every tenant route's documented success through ``c``; for the lifecycle test.

    ``c`` is a ``test_openapi.Contract``: each answer is checked against the published schema.
    """
    made = c.call("POST", "/tenants", 201, json={"id": "contract-team", "max_jobs": 3}).json()
    assert made["id"] == "contract-team" and made["max_jobs"] == 3 and made["jobs"] == 0
    assert "contract-team" in {t["id"] for t in c.call("GET", "/tenants", 200).json()["tenants"]}
    path = {"tenant_id": "contract-team"}
    assert c.call("GET", "/tenants/{tenant_id}", 200, path=path).json()["weight"] == 1.0
    patched = c.call(
        "PATCH", "/tenants/{tenant_id}", 200, path=path, json={"guaranteed_watts": 300}
    ).json()
    assert patched["guaranteed_watts"] == 300.0 and patched["max_jobs"] == 3
    c.call("DELETE", "/tenants/{tenant_id}", 204, path=path)
    c.call("GET", "/tenants/{tenant_id}", 404, path=path)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("tenants")
    with ServerProcess(d / "perseus.db", token=ADMIN) as s:
        yield s


@pytest.fixture(scope="module")
def admin(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.http_url, headers=_bearer(ADMIN), timeout=30.0) as c:
        yield c


def _tenant(admin: Any, tenant: str, **quotas: Any) -> dict[str, str]:
    assert admin.post("/tenants", json={"id": tenant, **quotas}).status_code == 201
    out = {}
    for scope in ("tenant", "tenant-read"):
        r = admin.post("/credentials", json={"scope": scope, "tenant": tenant})
        assert r.status_code == 201, r.text
        assert r.json()["tenant"] == tenant and r.json()["scope"] == scope
        out[scope] = r.json()["credential"]
    return out


def test_a_tenant_sees_and_changes_only_its_own_jobs(
    srv: ServerProcess, admin: httpx.Client
) -> None:
    a, b = _tenant(admin, "team-a"), _tenant(admin, "team-b")
    url = srv.http_url
    with (
        httpx.Client(base_url=url, headers=_bearer(a["tenant"]), timeout=30.0) as ta,
        httpx.Client(base_url=url, headers=_bearer(a["tenant-read"]), timeout=30.0) as ra,
        httpx.Client(base_url=url, headers=_bearer(b["tenant"]), timeout=30.0) as tb,
    ):
        mine = ta.post("/jobs", json=JOB)
        assert mine.status_code == 201 and mine.json()["tenant"] == "team-a", mine.text
        theirs = tb.post("/jobs", json={**JOB, "name": "b's secret job"}).json()["id"]
        default = admin.post("/jobs", json=JOB).json()
        assert default["tenant"] == "default"  # the single-tenant deployment's jobs
        mine_id = mine.json()["id"]
        # Listings: only its own.
        for client in (ta, ra):
            listed = {j["id"] for j in client.get("/jobs").json()["jobs"]}
            assert listed == {mine_id}
        assert {j["id"] for j in admin.get("/jobs").json()["jobs"]} >= {mine_id, theirs}
        # Another tenant's job id is no cursor of its listing: as an unknown id.
        for after in (theirs, "0" * 16):
            r = ta.get("/jobs", params={"after": after})
            assert r.status_code == 422 and problem_field(r) == "after", r.text
        assert ta.get("/jobs", params={"after": mine_id}).json()["jobs"] == []
        # Another tenant's job: 404, as an unknown job's, for every kind of request.
        for path in (f"/jobs/{theirs}", f"/jobs/{theirs}/status", f"/jobs/{theirs}/profile"):
            got, unknown = ta.get(path), ta.get(path.replace(theirs, "0" * 16))
            assert got.status_code == unknown.status_code == 404
            assert got.json()["detail"].replace(theirs, "0" * 16) == unknown.json()["detail"]
        assert ta.delete(f"/jobs/{theirs}").status_code == 404
        assert ta.post(f"/jobs/{theirs}/finish").status_code == 404
        assert admin.get(f"/jobs/{theirs}").status_code == 200  # untouched
        # Its read credential reads, never writes.
        assert ra.get(f"/jobs/{mine_id}/status").status_code == 200
        r = ra.post("/jobs", json=JOB)
        assert r.status_code == 403 and problem_field(r) == "Authorization"
        # Metrics: its jobs' series only, never another tenant's job or name.
        text = ta.get("/metrics").text
        assert mine_id in text and theirs not in text and default["id"] not in text
        assert "secret job" not in text
        assert f'perseus_job_info{{perseus_job="{mine_id}",name="",tenant="team-a"}} 1' in text
        assert theirs in admin.get("/metrics").text
        # Credentials: its tenant's and its jobs' rank credential, no other tenant's.
        creds = ta.get("/credentials").json()["credentials"]
        assert {c.get("tenant") for c in creds if "tenant" in c} == {"team-a"}
        assert {c.get("job_id") for c in creds if "job_id" in c} == {mine_id}
        # Tenants: its own only; another's 404.
        assert [t["id"] for t in ta.get("/tenants").json()["tenants"]] == ["team-a"]
        assert ta.get("/tenants/team-b").status_code == 404
        # Naming another tenant for a new job is refused.
        r = ta.post("/jobs", json={**JOB, "tenant": "team-b"})
        assert r.status_code == 422 and problem_field(r) == "tenant"
        # The admin alone manages tenants, quotas and credentials.
        for method, path, body in (
            ("POST", "/tenants", {"id": "mine"}),
            ("PATCH", "/tenants/team-a", {"max_jobs": 1000}),
            ("DELETE", "/tenants/team-a", None),
            ("POST", "/credentials", {"scope": "tenant", "tenant": "team-a"}),
            ("PUT", "/power-budget", {"watts": 1000}),
        ):
            r = ta.request(method, path, json=body)
            assert r.status_code == 403, (method, path, r.text)
        # Its own job: it plans, finishes and deletes it.
        assert ta.post(f"/jobs/{mine_id}/finish").status_code == 200
        assert ta.delete(f"/jobs/{mine_id}").status_code == 204


def test_quotas_hold_and_the_cap_cannot_be_filled_by_one_tenant(tmp_path: Path) -> None:
    # A server of 8 jobs: a tenant's default quota is a quarter of it.
    store = SqlStore.open(tmp_path / "perseus.db")
    service = PerseusService(store, Limits(max_jobs=8))
    service.load()
    app = create_app(service, credentials=Credentials(store, admin=ADMIN))
    try:
        with TestClient(app, headers=_bearer(ADMIN)) as admin:
            greedy = _tenant(admin, "greedy")
            g = {"headers": _bearer(greedy["tenant"])}
            made = [admin.post("/jobs", json=JOB, **g).status_code for _ in range(4)]
            assert made == [201, 201, 409, 409]
            r = admin.post("/jobs", json=JOB, **g)
            assert problem_field(r) == "max_jobs" and "quota of 2 jobs" in r.json()["detail"]
            # The others still get in.
            assert admin.post("/jobs", json=JOB).status_code == 201
            # A GPU quota: world sizes summed.
            # Quotas are reservations: 8 jobs for greedy would leave default none.
            r = admin.patch("/tenants/greedy", json={"max_jobs": 8, "max_gpus": 6})
            assert r.status_code == 409 and problem_field(r) == "max_jobs", r.text
            r = admin.patch("/tenants/greedy", json={"max_jobs": 6, "max_gpus": 6})
            assert r.status_code == 200, r.text
            r = admin.post("/jobs", json={**JOB, "data_parallel": 2}, **g)
            assert r.status_code == 409 and problem_field(r) == "max_gpus", r.text
            assert admin.post("/jobs", json=JOB, **g).status_code == 201
            metrics = admin.get("/metrics").text
            assert 'perseus_refusals_total{reason="job_quota",tenant="greedy"} 3' in metrics
            assert 'perseus_refusals_total{reason="gpu_quota",tenant="greedy"} 1' in metrics
            # A tenant with jobs cannot be deleted, nor can the default one.
            assert admin.delete("/tenants/greedy").status_code == 409
            assert admin.delete("/tenants/default").status_code == 409
    finally:
        store.close()


def test_bad_tenants_and_credentials_are_refused_naming_the_field(admin: httpx.Client) -> None:
    for body, field in (
        ({"id": "Not A Namespace"}, "id"),
        ({"id": "ok", "weight": 0}, "weight"),
        ({"id": "ok", "guaranteed_watts": -1}, "guaranteed_watts"),
        ({"id": "ok", "max_jobs": -1}, "max_jobs"),
        ({"id": "ok", "colour": "red"}, "colour"),
    ):
        r = admin.post("/tenants", json=body)
        assert r.status_code == 422 and problem_field(r) == field, (body, r.text)
    assert admin.get("/tenants/ok").status_code == 404  # nothing stored
    admin.post("/tenants", json={"id": "dup"})
    assert admin.post("/tenants", json={"id": "dup"}).status_code == 409
    for body in (
        {"scope": "tenant"},
        {"scope": "tenant-read", "tenant": "nobody"},
        {"scope": "read", "tenant": "dup"},
    ):
        r = admin.post("/credentials", json=body)
        assert r.status_code == 422 and problem_field(r) == "tenant", (body, r.text)
    r = admin.post("/jobs", json={**JOB, "tenant": "nobody"})
    assert r.status_code == 422 and problem_field(r) == "tenant"
    r = admin.patch("/tenants/nobody", json={"max_jobs": 1})
    assert r.status_code == 404 and problem_field(r) == "tenant_id"


def test_metrics_route_alerts_and_stay_bounded(
    srv: ServerProcess, admin: httpx.Client, small_csv: str
) -> None:
    """``/metrics`` for alerts: job info, ranks without clock control, bounded slowdown series.

    ``perseus_job_info`` to join on, the node of ranks without clock control, and a 64-pipeline
    job that adds 8 pipeline slowdown series (its slowest) and its min and max.
    """
    import grpc
    from prometheus_client.parser import text_string_to_metric_families

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc

    from ..conftest import solved_job

    job = solved_job(admin, small_csv, data_parallel=64, name="wide")
    unavailable = pb.ClockControl(state=pb.CLOCK_CONTROL_UNAVAILABLE, reason="no daemon")
    with grpc.insecure_channel(srv.grpc_target) as ch:
        stub = pb_grpc.PlanServiceStub(ch)
        for g, (node, cc) in enumerate(
            [("node-a", unavailable), ("node-a", unavailable), ("node-b", unavailable),
             ("node-c", None)]
        ):  # fmt: skip
            req = pb.RegisterRankRequest(
                job_id=job, global_rank=g, pipeline_rank=g % 2, data_rank=g // 2, hostname=node
            )
            if cc is not None:
                req.clock_control.CopyFrom(cc)
            stub.RegisterRank(req, metadata=(("authorization", f"Bearer {ADMIN}"),), timeout=10)
    fams = {f.name: f for f in text_string_to_metric_families(admin.get("/metrics").text)}

    def samples(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {
            tuple(sorted(s.labels.items())): s.value
            for s in fams[name].samples
            if s.labels.get("perseus_job") == job
        }

    assert samples("perseus_job_info") == {
        (("name", "wide"), ("perseus_job", job), ("tenant", "default")): 1.0
    }
    assert samples("perseus_ranks_without_clock_control") == {
        (("node", "node-a"), ("perseus_job", job)): 2.0,
        (("node", "node-b"), ("perseus_job", job)): 1.0,
    }
    slow = samples("perseus_deployed_slowdown_ratio")
    assert len(slow) == 8  # of 64 pipelines
    ranges = samples("perseus_job_deployed_slowdown_ratio")
    assert set(ranges) == {
        (("perseus_job", job), ("stat", "min")),
        (("perseus_job", job), ("stat", "max")),
    }
    assert max(slow.values()) == ranges[(("perseus_job", job), ("stat", "max"))]
    tenants = {s.labels["tenant"] for s in fams["perseus_tenant_info"].samples}
    assert "default" in tenants


def test_a_cached_plan_is_still_another_tenants_404(
    srv: ServerProcess, admin: httpx.Client, small_csv: str
) -> None:
    c, d = _tenant(admin, "team-c"), _tenant(admin, "team-d")
    url = srv.http_url
    with (
        httpx.Client(base_url=url, headers=_bearer(c["tenant-read"]), timeout=30.0) as rc,
        httpx.Client(base_url=url, headers=_bearer(d["tenant"]), timeout=30.0) as td,
        httpx.Client(base_url=url, headers=_bearer(c["tenant"]), timeout=30.0) as tc,
    ):
        job = solved_job(tc, small_csv)
        path, query = f"/jobs/{job}/plan", {"slowdown": 0.05}
        mine = [tc.get(path, params=query), rc.get(path, params=query)]  # the second: cached
        assert [r.status_code for r in mine] == [200, 200] and mine[0].content == mine[1].content
        got, unknown = td.get(path, params=query), td.get(path.replace(job, "0" * 16), params=query)
        assert got.status_code == unknown.status_code == 404, got.text
        assert got.json()["detail"].replace(job, "0" * 16) == unknown.json()["detail"]
