"""The REST routes, the gate's rule and the endpoint table of ``docs/server.md`` stay in step.

Every route of the application (from its own router, :mod:`tests.server.routes`) is a row of the
table, named with the router module that serves it and the credential the gate asks of it, and every
row is a route (or a page the gate leaves public). A new route fails here until it is classified in
the table; a route whose credential changes fails until the table says so.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from perseus_server.config import Limits, ZeusConfig
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.authorization import PUBLIC, Access, rule_of
from perseus_server.service.credentials import Scope

from ..routes import app_routes

DOC = Path(__file__).resolve().parents[3] / "docs" / "server.md"
ROW = re.compile(r"^\| `(GET|HEAD|POST|PUT|PATCH|DELETE) (/[^`]*)` \| `(\w+)\.py` \| (\w+) \|$")

#: The pages served outside the gate (``rest/swagger.py``, ``rest/ui.py``): public, no data.
PAGES = {("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/ui")}


def _table() -> dict[tuple[str, str], tuple[str, str]]:
    """(method, path) -> (router module, credential) of the doc's endpoint table."""
    section = DOC.read_text().split("### Endpoints", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for line in rows:
        m = ROW.match(line)
        assert m, f"an endpoint row the test cannot read: {line!r}"
        key = (m.group(1), m.group(2))
        assert key not in table, f"{key} is listed twice"
        table[key] = (m.group(3), m.group(4))
    return table


def _gate_credential(route: APIRoute) -> str:
    """The cluster-wide credential the gate asks for: from the rule the route declares."""
    rule = rule_of(route.endpoint)  # its row of the authorization table (test_gate_rules)
    assert rule is not None, route.path
    if rule is PUBLIC:
        return "none"
    if rule[Scope.ZEUS] is not Access.NONE:
        return "zeus"
    return "read" if rule[Scope.READ] is not Access.NONE else "admin"


def test_every_route_is_in_the_table_with_its_router_and_credential(tmp_path: Path) -> None:
    table = _table()
    walked = app_routes(tmp_path, token="x", zeus_routes=ZeusConfig())  # with --zeus's routes
    routes = {(m, r.path): r for r in walked for m in r.methods}
    unlisted = sorted(set(routes) - set(table))
    assert not unlisted, f"classify these in docs/server.md, 'Endpoints': {unlisted}"
    stale = sorted(set(table) - set(routes) - PAGES)
    assert not stale, f"docs/server.md lists endpoints that are gone: {stale}"
    for (method, path), route in routes.items():
        router = route.endpoint.__module__.rsplit(".", 1)[1]
        want = (router, _gate_credential(route))
        assert table[(method, path)] == want, (method, path)


def test_the_pages_in_the_table_are_public(tmp_path: Path) -> None:
    """The pages the table lists answer without a credential on a server with a token.

    And a gated route does not (so the page rows are not vacuous).
    """
    table = _table()
    pages = {k for k, (_, credential) in table.items() if k in PAGES}
    assert pages == PAGES and all(table[k][1] == "none" for k in pages)
    store = SqlStore.open(tmp_path / "pages.db")
    try:
        app = create_app(PerseusService(store, Limits()), token="x")
        with TestClient(app, base_url="http://localhost") as client:
            for method, path in sorted(pages):
                assert client.request(method, path).status_code == 200, path
            assert client.get("/jobs").status_code == 401
    finally:
        store.close()


def test_the_table_reader_sees_every_kind_of_row() -> None:
    # A broken reader (a renamed heading, another row format) must not pass vacuously.
    table = _table()
    assert table[("GET", "/healthz")] == ("monitoring", "none")
    assert table[("GET", "/jobs")] == ("jobs", "read")
    assert table[("PUT", "/power-budget")] == ("power_budget", "admin")
    assert len(table) >= 33
