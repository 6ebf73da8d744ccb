"""Each route declares its one access rule, and the gate denies what no route declares.

A route's row of the authorization table is the rule on its function (``@allow``), read from the
routers when the app is built (:func:`perseus_server.rest.gate.route_rules`), as a gRPC method's is
the rule in its declaration. Checked here: every route of the app (``--zeus``'s included) has
exactly one; a route without one, a second one, or two routes of one key stop the table from
being built; and on a real ``perseus serve`` a path or a method no route declares is refused to
every credential but the admin's (403 naming ``Authorization``), while the admin reaches the
router's own 404 / 405.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter

from perseus_server import ServerProcess
from perseus_server.config import ZeusConfig
from perseus_server.rest.gate import public_paths, route_rules
from perseus_server.service.authorization import (
    ADMIN_ONLY,
    JOB_READ,
    PUBLIC,
    allow,
    rule_of,
    table,
)

from ..conftest import problem_field
from ..routes import app_routes
from .test_gate_scopes import read_token_args

ADMIN = "the-admin-token"
READ = "the-read-token"
JOB = {"stages": 2, "microbatches": 2, "blocking_power": 70.0}


def test_every_route_declares_exactly_one_rule(tmp_path: Path) -> None:
    routes = app_routes(tmp_path, token="x", zeus_routes=ZeusConfig())
    undeclared = [r.path for r in routes if rule_of(r.endpoint) is None]
    assert not undeclared, f"routes without @allow: {undeclared}"
    rules = route_rules(routes)
    assert set(rules) == {f"{m} {r.path}" for r in routes for m in r.methods}
    assert len(rules) == sum(len(r.methods) for r in routes) >= 39
    # The one public route is the liveness probe; the gate reads its path from its rule.
    assert public_paths(rules) == {"/healthz"}
    assert [k for k, rule in rules.items() if rule is PUBLIC] == ["GET /healthz"]


def test_a_route_without_a_rule_stops_the_table() -> None:
    router = APIRouter()

    @router.get("/declared")
    @allow(JOB_READ)
    async def declared() -> None: ...

    @router.post("/forgotten")
    async def forgotten() -> None: ...

    with pytest.raises(ValueError, match=r"POST /forgotten: no access rule declared"):
        route_rules(router.routes)
    assert route_rules(router.routes[:1]) == {"GET /declared": JOB_READ}


def test_a_rule_is_declared_once_per_route_and_key() -> None:
    async def endpoint() -> None: ...

    allow(JOB_READ)(endpoint)
    with pytest.raises(TypeError, match="declared twice"):
        allow(ADMIN_ONLY)(endpoint)
    assert rule_of(endpoint) is JOB_READ  # the first rule stays

    router = APIRouter()
    router.add_api_route("/twice", endpoint, methods=["GET"])
    router.add_api_route("/twice", endpoint, methods=["GET"])
    with pytest.raises(ValueError, match=r"GET /twice: declared twice"):
        route_rules(router.routes)
    with pytest.raises(ValueError, match=r"WatchPlan: declared twice"):
        table([("WatchPlan", JOB_READ), ("WatchPlan", JOB_READ)])


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("rules")
    with ServerProcess(d / "perseus.db", token=ADMIN, extra_args=read_token_args(d, READ)) as s:
        yield s


def _as(srv: ServerProcess, token: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=srv.http_url, headers=headers, timeout=30.0)


def test_what_no_route_declares_is_the_admins_only(srv: ServerProcess) -> None:
    with _as(srv, ADMIN) as admin:
        assert admin.post("/tenants", json={"id": "team-a"}).status_code == 201
        r = admin.post("/credentials", json={"scope": "tenant", "tenant": "team-a"})
        tenant = r.json()["credential"]
        r = admin.post("/jobs", json={**JOB, "tenant": "team-a"})
        assert r.status_code == 201, r.text
        job, rank = r.json()["id"], r.json()["rank_credential"]
        # No route: an unknown path, an unknown sub-path of a job, a method no route of a
        # declared path has.
        unknown = [("GET", "/nope"), ("GET", f"/jobs/{job}/nope"), ("PATCH", f"/jobs/{job}")]
        want_admin = {"/nope": 404, f"/jobs/{job}/nope": 404, f"/jobs/{job}": 405}
        for method, path in unknown:
            assert admin.request(method, path).status_code == want_admin[path], (method, path)
    for token in (READ, tenant, rank):
        with _as(srv, token) as caller:
            for method, path in unknown:
                r = caller.request(method, path)
                assert r.status_code == 403, (token, method, path, r.text)
                assert problem_field(r) == "Authorization"
                assert "it needs the admin scope" in r.json()["detail"]
            # the declared routes still answer what their rules give this credential
            assert caller.get(f"/jobs/{job}/status").status_code == 200
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as anonymous:
        assert anonymous.get("/healthz").status_code == 200  # declared PUBLIC
        assert anonymous.get("/nope").status_code == 401
