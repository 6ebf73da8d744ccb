"""The authorization table, every cell checked against a real ``perseus serve``.

The table's rules are named in :mod:`perseus_server.service.authorization`; its REST rows are the
rules the routes declare (``@allow``, read from the app's own router), its gRPC rows those of
:mod:`perseus_server.grpc.methods`; its cells are credential kind x route or gRPC method (from
the ``.proto``) x own / other tenant.

A route without a rule stops the app from being built (``tests/server/rest/test_gate_rules.py``)
and a method that is not declared fails :func:`test_every_route_and_method_is_classified`, so a
new one is classified the day it is added. Each cell runs on fresh jobs (a job of the caller's tenant, one of another tenant) so a
write that is allowed does not change what the next cell sees:

- ``none``: 403 naming ``Authorization`` (gRPC: PERMISSION_DENIED);
- ``own`` on another tenant's job or tenant: 404, the body an unknown id gets;
- ``any``, and ``own`` on the caller's own: the route runs (never 401/403, nor the 404 of an
  unknown job).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.config import ZeusConfig
from perseus_server.grpc.methods import GRPC
from perseus_server.rest.gate import route_rules
from perseus_server.service.authorization import PUBLIC, Access, Rule, markdown_table
from perseus_server.service.credentials import Scope

from ..rest.test_gate_scopes import read_token_args
from ..routes import app_routes

ADMIN = "the-admin-token"
READ = "the-read-token"
JOB = {"stages": 2, "microbatches": 2, "blocking_power": 70.0}
ROOT = Path(__file__).resolve().parents[3]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("authz")
    # Zeus's routes are in the table too. Two tenants of 1,000 jobs each: quotas are
    # reservations, so the server holds room for them.
    args = [*read_token_args(d, READ), "--zeus", "--max-jobs", "3000"]
    with ServerProcess(d / "perseus.db", token=ADMIN, extra_args=args) as s:
        yield s


@pytest.fixture(scope="module")
def admin(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.http_url, headers=_bearer(ADMIN), timeout=30.0) as c:
        for tenant in ("team-a", "team-b"):
            r = c.post("/tenants", json={"id": tenant, "max_jobs": 1000})
            assert r.status_code == 201, r.text
        yield c


@pytest.fixture(scope="module")
def tokens(admin: httpx.Client) -> dict[Scope, str]:
    """A credential of each kind but rank (a rank credential comes with each fresh job).

    The tenant ones of ``team-a``. The zeus one is sent as a bearer header here, as every other
    (in a URL it opens the same routes: tests/server/rest/test_zeus_routes.py).
    """
    out = {Scope.ADMIN: ADMIN, Scope.READ: READ}
    for scope in (Scope.TENANT, Scope.TENANT_READ, Scope.ZEUS):
        r = admin.post("/credentials", json={"scope": scope.value, "tenant": "team-a"})
        assert r.status_code == 201, r.text
        out[scope] = r.json()["credential"]
    return out


def _job(admin: httpx.Client, tenant: str) -> tuple[str, str]:
    r = admin.post("/jobs", json={**JOB, "tenant": tenant})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["rank_credential"]


def _routes(tmp: Path) -> list[tuple[str, str]]:
    routes = app_routes(tmp, token="x", zeus_routes=ZeusConfig())
    return sorted({(m, r.path) for r in routes for m in r.methods})


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, Rule]:
    """The REST rows: every route's declared rule (``--zeus``'s routes included)."""
    routes = app_routes(tmp_path_factory.mktemp("rules"), token="x", zeus_routes=ZeusConfig())
    return route_rules(routes)


def test_every_route_and_method_is_classified(tmp_path: Path, rest: Mapping[str, Rule]) -> None:
    routes = {f"{m} {p}" for m, p in _routes(tmp_path)}
    assert routes == set(rest), (
        f"unclassified: {sorted(routes - set(rest))}; gone: {sorted(set(rest) - routes)}"
    )
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["PlanService"].methods}
    assert methods == set(GRPC)
    for rule in [*rest.values(), *GRPC.values()]:
        assert set(rule) == set(Scope) and rule[Scope.ADMIN] is Access.ANY


def test_the_table_keeps_tenants_apart(rest: Mapping[str, Rule]) -> None:
    """The table keeps tenants apart: what the cells must say, whatever is added.

    A tenant's credentials never reach another tenant's jobs; read-only kinds change nothing; a
    rank credential reads only its job's status on REST; tenants, quotas, credentials and the
    cluster budget are the admin's.
    """
    for key, rule in rest.items():
        method, path = key.split(" ", 1)
        if rule is PUBLIC:
            assert key == "GET /healthz", key  # the one route that needs no credential
            continue
        for kind in (Scope.TENANT, Scope.TENANT_READ):
            assert rule[kind] in (Access.OWN, Access.NONE), (key, kind)
        if method != "GET":
            assert rule[Scope.READ] is Access.NONE and rule[Scope.TENANT_READ] is Access.NONE
        expected_rank = Access.OWN if key == "GET /jobs/{job_id}/status" else Access.NONE
        assert rule[Scope.RANK] is expected_rank, key
        # a zeus credential (in a URL) opens its tenant's Zeus runs and nothing else
        expected_zeus = Access.OWN if path.startswith("/zeus/") else Access.NONE
        assert rule[Scope.ZEUS] is expected_zeus, key
        admin_only = (
            path.startswith("/tenants") or path.startswith("/power-budget") or "credentials" in path
        ) and method != "GET"
        if admin_only and "{job_id}" not in path:
            assert all(rule[k] is Access.NONE for k in Scope if k is not Scope.ADMIN), key
    for name, rule in GRPC.items():
        assert rule[Scope.RANK] is Access.OWN, name
        assert all(
            rule[k] is Access.NONE
            for k in (Scope.READ, Scope.TENANT, Scope.TENANT_READ, Scope.ZEUS)
        )


def test_the_docs_print_the_table(rest: Mapping[str, Rule]) -> None:
    assert markdown_table(rest, GRPC) in (ROOT / "docs" / "server.md").read_text()


def _unknown_detail(r: httpx.Response, param: str, value: str) -> bool:
    """Whether ``r`` is the 404 an unknown ``param`` gets."""
    if r.status_code != 404:
        return False
    body = r.json()
    return body.get("field") == param and repr(value)[:66] in body.get("detail", "")


def test_every_rest_cell(
    tmp_path: Path, admin: httpx.Client, tokens: dict[Scope, str], rest: Mapping[str, Rule]
) -> None:
    cells = 0
    kept = (*_job(admin, "team-a"), _job(admin, "team-b")[0])  # what GET cells read
    caller = httpx.Client(base_url=admin.base_url, timeout=30.0)  # each cell sends its token
    for method, template in _routes(tmp_path):
        key = f"{method} {template}"
        if rest[key] is PUBLIC:
            continue
        for kind in Scope:
            for side in ("own", "other"):
                want = rest[key][kind]
                # A write cell the table lets through gets fresh jobs (it may change them);
                # a refused one must not change anything (checked at the end).
                fresh = method != "GET" and (
                    want is Access.ANY or (want is Access.OWN and side == "own")
                )
                own_job, rank_token, other_job = (
                    (*_job(admin, "team-a"), _job(admin, "team-b")[0]) if fresh else kept
                )
                job = own_job if side == "own" else other_job
                tenant = "team-a" if side == "own" else "team-b"
                cred = "cred-none"
                if "{credential_id}" in template:
                    cred = admin.post("/credentials", json={"scope": "read"}).json()["id"]
                path = (
                    template.replace("{job_id}", job)
                    .replace("{tenant_id}", tenant)
                    .replace("{credential_id}", cred)
                )
                token = rank_token if kind is Scope.RANK else tokens[kind]
                r = caller.request(method, path, headers=_bearer(token), json={})
                where = f"{key} as {kind} on {side}: {r.status_code} {r.text[:200]}"
                assert r.status_code < 500, where
                params = [p for p in ("job_id", "tenant_id") if "{" + p + "}" in template]
                if want is Access.NONE:
                    assert r.status_code == 403, where
                    assert r.json()["field"] == "Authorization", where
                elif want is Access.OWN and side == "other" and params:
                    value = job if params[0] == "job_id" else tenant
                    assert _unknown_detail(r, params[0], value), where
                else:
                    assert r.status_code not in (401, 403), where
                    if "job_id" in params:
                        assert not _unknown_detail(r, "job_id", job), where
                    if "tenant_id" in params:
                        assert not _unknown_detail(r, "tenant_id", tenant), where
                cells += 1
                if fresh:
                    for j in (own_job, other_job):
                        admin.delete(f"/jobs/{j}")
    caller.close()
    public = [key for key, rule in rest.items() if rule is PUBLIC]
    assert cells == 2 * len(Scope) * (len(rest) - len(public))
    # The refused writes changed nothing: the kept jobs are there, untouched.
    for job in (kept[0], kept[2]):
        view = admin.get(f"/jobs/{job}").json()
        assert view["plan_version"] == 0 and view["lifecycle"]["state"] == "active", view
        assert view["profile"] is None


def _grpc_call(ch: grpc.Channel, name: str, req: Any, token: str) -> grpc.StatusCode:
    service = pb.DESCRIPTOR.services_by_name["PlanService"]
    method = service.methods_by_name[name]
    path = f"/{service.full_name}/{name}"
    metadata = (("authorization", f"Bearer {token}"),)
    ser = type(req).SerializeToString
    try:
        if method.client_streaming:
            ch.stream_unary(path, ser, lambda b: b)(iter([req]), metadata=metadata, timeout=10)
        elif method.server_streaming:
            stream = ch.unary_stream(path, ser, lambda b: b)(req, metadata=metadata, timeout=2)
            next(iter(stream))
            stream.cancel()
        else:
            ch.unary_unary(path, ser, lambda b: b)(req, metadata=metadata, timeout=10)
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _request(name: str, job_id: str, rank_id: str) -> Any:
    """A request of method ``name`` naming the job and rank.

    A request of only ``job_id`` and ``rank_id`` is built from the ``.proto``: a new such
    method needs nothing here.
    """
    if name == "RegisterRank":
        return pb.RegisterRankRequest(
            job_id=job_id, global_rank=1, pipeline_rank=1, gpu_name="NVIDIA A40", hostname="n"
        )
    if name == "ReportIterations":
        return pb.IterationReport(job_id=job_id, rank_id=rank_id, iteration=1, iteration_time=0.1)
    method = pb.DESCRIPTOR.services_by_name["PlanService"].methods_by_name[name]
    return getattr(pb, method.input_type.name)(job_id=job_id, rank_id=rank_id)


def test_every_grpc_cell(srv: ServerProcess, admin: httpx.Client, tokens: dict[Scope, str]) -> None:
    denied = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
    cells = 0
    with grpc.insecure_channel(srv.grpc_target) as ch:
        stub = pb_grpc.PlanServiceStub(ch)
        for name, rule in GRPC.items():
            for kind in Scope:
                for side in ("own", "other"):
                    own_job, rank_token = _job(admin, "team-a")
                    other_job, other_rank = _job(admin, "team-b")
                    token = rank_token if kind is Scope.RANK else tokens[kind]
                    job, job_token = (
                        (own_job, rank_token) if side == "own" else (other_job, other_rank)
                    )
                    # A rank of the job, registered by the job's own rank credential.
                    rank = stub.RegisterRank(
                        pb.RegisterRankRequest(
                            job_id=job, global_rank=0, pipeline_rank=0, hostname="n"
                        ),
                        metadata=(("authorization", f"Bearer {job_token}"),),
                        timeout=10,
                    )
                    code = _grpc_call(ch, name, _request(name, job, rank.rank_id), token)
                    where = f"{name} as {kind} on {side}: {code}"
                    want = rule[kind]
                    if want is Access.NONE or (want is Access.OWN and side == "other"):
                        assert code == grpc.StatusCode.PERMISSION_DENIED, where
                    else:
                        assert code not in denied, where
                    cells += 1
                    for j in (own_job, other_job):
                        admin.delete(f"/jobs/{j}")
    assert cells == 2 * len(Scope) * len(GRPC)
