"""Scopes on every route and gRPC method of a real ``perseus serve``.

With an admin token, a configured read token and issued credentials. The routes come from the app's
own router (not a hand-made list), so a new route is covered the day it is added: with a read
credential every ``GET``/``HEAD`` answers (never 401/403) and every other method 403 naming the
admin scope; a rank credential opens only its own job's status on REST; read and rank credentials
outside their job get PERMISSION_DENIED on gRPC.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_server import ServerProcess

from ..conftest import problem_field, register, solved_job
from ..routes import app_routes

ADMIN = "the-admin-token"
READ = "the-read-token"
PUBLIC = {"/healthz"}
SAFE = {"GET", "HEAD"}


def read_token_args(tmp: Path, token: str = READ) -> list[str]:
    """``perseus serve`` options for a read token (the file readable by its owner only)."""
    f = tmp / "read-token"
    f.write_text(token + "\n")
    f.chmod(0o600)
    return ["--read-token-file", str(f)]


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("scopes")
    with ServerProcess(d / "perseus.db", token=ADMIN, extra_args=read_token_args(d)) as srv:
        yield srv


@pytest.fixture(scope="module")
def admin(scoped: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=scoped.http_url, headers=scoped.headers, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def job(admin: httpx.Client, small_csv: str) -> str:
    return solved_job(admin, small_csv)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def every_route(tmp: Path) -> list[tuple[str, str]]:
    """(method, path template) of every API route of the app, from its router."""
    routes = app_routes(tmp, token="x")
    return sorted({(m, r.path) for r in routes for m in r.methods})


def _walk(tmp: Path, job_id: str) -> Iterator[tuple[str, str, str]]:
    """(method, route template, concrete path) of every API route but the public ones."""
    routes = every_route(tmp)
    assert len(routes) >= 29
    for method, template in routes:
        if template in PUBLIC:
            continue
        path = template.replace("{job_id}", job_id).replace("{credential_id}", "cred-none")
        yield method, template, path


def _state(admin: httpx.Client, job_id: str) -> Any:
    view = admin.get(f"/jobs/{job_id}").json()
    status = admin.get(f"/jobs/{job_id}/status").json()
    return (
        view["state"],
        view["plan_version"],
        status["plan"],
        status["pipelines"],
        status["straggler_detection"],
        admin.get("/power-budget").status_code,
    )


def test_read_credential_on_every_route(
    tmp_path: Path, scoped: ServerProcess, admin: httpx.Client, job: str
) -> None:
    issued = admin.post("/credentials", json={"scope": "read"})
    assert issued.status_code == 201, issued.text
    before = _state(admin, job)
    reads = writes = 0
    for token in (READ, issued.json()["credential"]):
        with httpx.Client(base_url=scoped.http_url, headers=_bearer(token), timeout=30.0) as ro:
            for method, template, path in _walk(tmp_path, job):
                r = ro.request(method, path, json={})
                where = f"{method} {template}"
                assert r.status_code < 500, f"{where}: {r.status_code} {r.text[:300]}"
                if method in SAFE:
                    assert r.status_code not in (401, 403), f"{where}: {r.text[:300]}"
                    reads += 1
                else:
                    assert r.status_code == 403, f"{where}: {r.status_code} {r.text[:300]}"
                    assert problem_field(r) == "Authorization", where
                    body = r.json()
                    assert body["scope"] == "admin" and "admin scope" in body["detail"], where
                    writes += 1
            assert ro.get("/openapi.json").status_code == 200
            assert ro.get("/metrics").status_code == 200
    assert reads >= 2 * 11 and writes >= 2 * 17
    assert _state(admin, job) == before  # no write got through


def test_no_or_a_wrong_token_is_refused_everywhere(
    tmp_path: Path, scoped: ServerProcess, job: str
) -> None:
    checked = 0
    with httpx.Client(base_url=scoped.http_url, timeout=30.0) as anon:
        for method, template, path in _walk(tmp_path, job):
            for headers in ({}, _bearer("wrong"), _bearer(READ + "x"), {"Authorization": READ}):
                r = anon.request(method, path, headers=headers, json={})
                assert r.status_code == 401, f"{method} {template} {headers}: {r.text[:200]}"
                assert problem_field(r) == "Authorization"
                checked += 1
    assert checked >= 4 * 28


def test_the_admin_token_opens_every_route(
    tmp_path: Path, scoped: ServerProcess, admin: httpx.Client, job: str
) -> None:
    for method, template, path in _walk(tmp_path, job):
        if method not in SAFE:
            continue  # the read walk proves writes are refused to others; here: reads open
        r = admin.request(method, path)
        assert r.status_code not in (401, 403) and r.status_code < 500, f"{method} {template}"


def test_rank_credential_opens_only_its_own_jobs_status(
    tmp_path: Path, scoped: ServerProcess, admin: httpx.Client, job: str
) -> None:
    rank_secret = admin.post(f"/jobs/{job}/credentials/rotate").json()["credential"]
    other = admin.post("/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0})
    before = _state(admin, job)
    checked = 0
    with httpx.Client(base_url=scoped.http_url, headers=_bearer(rank_secret), timeout=30.0) as rc:
        for method, template, path in _walk(tmp_path, job):
            r = rc.request(method, path, json={})
            if (method, template) == ("GET", "/jobs/{job_id}/status"):
                assert r.status_code == 200 and r.json()["job_id"] == job, r.text[:200]
                continue
            assert r.status_code == 403, f"{method} {template}: {r.status_code} {r.text[:200]}"
            assert problem_field(r) == "Authorization"
            checked += 1
        assert rc.get("/healthz").status_code == 200
        # Another job's status: 404, as an unknown job's.
        elsewhere = rc.get(f"/jobs/{other.json()['id']}/status")
        unknown = rc.get("/jobs/0123456789abcdef/status")
        assert elsewhere.status_code == unknown.status_code == 404
        assert elsewhere.json()["field"] == "job_id"
    assert checked >= 25
    assert _state(admin, job) == before


def _grpc_calls(
    ch: grpc.Channel, job_id: str, rank_id: str
) -> Iterator[tuple[str, Any, Any, bool]]:
    """(method, callable, argument, streams) of every PlanService method, aimed at the job."""
    service = pb.DESCRIPTOR.services_by_name["PlanService"]
    assert len(service.methods) >= 3
    for method in service.methods:
        path = f"/{service.full_name}/{method.name}"
        req_cls = getattr(pb, method.input_type.name)
        fields = {f.name for f in req_cls.DESCRIPTOR.fields}
        req = req_cls(
            **{k: v for k, v in (("job_id", job_id), ("rank_id", rank_id)) if k in fields}
        )
        if method.client_streaming:
            call = ch.stream_unary(path, req_cls.SerializeToString, lambda b: b)
            yield method.name, call, [req], False
        elif method.server_streaming:
            call = ch.unary_stream(path, req_cls.SerializeToString, lambda b: b)
            yield method.name, call, req, True
        else:
            call = ch.unary_unary(path, req_cls.SerializeToString, lambda b: b)
            yield method.name, call, req, False


def _code(call: Any, arg: Any, streams: bool, token: str) -> grpc.StatusCode:
    metadata = (("authorization", f"Bearer {token}"),)
    try:
        result = call(iter(arg) if isinstance(arg, list) else arg, metadata=metadata, timeout=10)
        if streams:
            next(iter(result))
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_grpc_scopes(scoped: ServerProcess, admin: httpx.Client, job: str) -> None:
    other = admin.post("/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0})
    assert other.status_code == 201
    other_secret = other.json()["rank_credential"]
    with grpc.insecure_channel(scoped.grpc_target) as ch:
        from perseus_common.proto import perseus_pb2_grpc as pb_grpc

        rank_id = register(pb_grpc.PlanServiceStub(ch), job, 0, 0, metadata=scoped.grpc_metadata)
        checked = 0
        for name, call, arg, streams in _grpc_calls(ch, job, rank_id.rank_id):
            for token in (READ, other_secret):
                assert _code(call, arg, streams, token) == grpc.StatusCode.PERMISSION_DENIED, (
                    name,
                    token[:14],
                )
                checked += 1
        assert checked >= 6
