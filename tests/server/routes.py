"""The REST application's routes, taken from its own router (not a hand-made list).

So that the tests that walk every route cover a new one the day it is added, included routers too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute

from perseus_server.config import Limits
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

__all__ = ["api_routes", "app_routes"]


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every ``APIRoute`` in ``routes``, descending into included routers.

    FastAPI keeps those in an ``_IncludedRouter`` entry, not as ``APIRoute`` entries of the app.
    """
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):
            prefix = str(getattr(getattr(route, "include_context", None), "prefix", "") or "")
            # A prefixed router's routes would carry paths without it: none is used today.
            assert not prefix, f"an included router with prefix {prefix!r}: walk it with it"
            yield from api_routes(list(route.original_router.routes))


def app_routes(tmp: Path, **app_options: Any) -> list[APIRoute]:
    """Every API route of the REST application.

    Checked to cover every operation its OpenAPI document lists.
    """
    store = SqlStore.open(tmp / "walk.db")
    try:
        app = create_app(PerseusService(store, Limits()), **app_options)
        found = list(api_routes(list(app.routes)))
        documented = {(m.upper(), p) for p, item in app.openapi()["paths"].items() for m in item}
    finally:
        store.close()
    walked = {(m, r.path) for r in found for m in r.methods}
    assert documented <= walked, documented - walked
    return found
