"""The plan query's fast path: a repeated ``GET /jobs/{id}/plan`` answered from its kept bytes.

Plan queries are the hot read (a rank's supervisor, a dashboard, Zeus's client ask the same
query again and again). :class:`PlanQueriesFirst`, the REST application, hands them straight to
the :class:`~perseus_server.rest.gate.Gate`, and :class:`PlanAnswerFront`, just inside it, answers
one the service has kept (:meth:`PerseusService.cached_plan`; the keeping is the service's:
:class:`~perseus_server.service.plans.PlanQueries`). Anything else goes the usual way to the
routes (:mod:`perseus_server.rest.plans`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from perseus_server.rest.gate import Gate
from perseus_server.service import PerseusService

__all__ = ["PlanAnswerFront", "PlanQueriesFirst", "plan_job"]


class PlanAnswerFront:
    """Pure ASGI middleware inside the gate that answers a repeated plan query from its bytes.

    The gate has authorized the request. ``GET /jobs/{id}/plan?<query>`` answered with the bytes
    the route built for that exact query string while they stand
    (:meth:`PerseusService.cached_plan`), sent as the route's ``Response`` sends them, without
    routing, parsing the query or selecting again. Anything else, and a query not answered
    before, goes on to the app.
    """

    def __init__(self, app: ASGIApp, *, service: PerseusService) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a plan query from its built bytes when they stand; else pass it on."""
        body = self._cached(scope)
        if body is None:
            await self.app(scope, receive, send)
            return
        # The route's label for the gate's request metrics, as routing would have set it.
        scope["route"] = _PLAN_ROUTE
        headers = [(b"content-length", str(len(body)).encode()), _JSON]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _cached(self, scope: Scope) -> bytes | None:
        if scope["type"] != "http" or scope.get("method") != "GET":
            return None
        job_id = plan_job(str(scope.get("path", "")))
        if job_id is None:
            return None
        return self.service.cached_plan(job_id, scope.get("query_string", b""))


def plan_job(path: str) -> str | None:
    """The job of a ``/jobs/{job_id}/plan`` path (None: another path)."""
    if not (path.startswith("/jobs/") and path.endswith("/plan")):
        return None
    job_id = path[len("/jobs/") : -len("/plan")]
    return job_id if job_id and "/" not in job_id else None


class _Route:
    """What the gate reads of a matched route: its path template."""

    path = "/jobs/{job_id}/plan"


_PLAN_ROUTE = _Route()
_JSON = (b"content-type", b"application/json")


class PlanQueriesFirst(FastAPI):
    """The REST application, whose plan queries go straight to its gate.

    Plan queries (``GET /jobs/{id}/plan``) go straight to the
    :class:`~perseus_server.rest.gate.Gate` of its middleware (and so to
    :class:`PlanAnswerFront` inside it, then the routes) instead of through the outer layers
    first: FastAPI's telemetry (this server configures none), the server-error middleware (the
    gate answers an unexpected error itself) and the body limit, the ``/ui`` and ``/docs``
    pages' fronts (other paths). Every check the gate makes (framing, hosts, credentials,
    scopes, tenants, the body's size, metrics) applies as before; every other request takes the
    whole stack.
    """

    _gate: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send a plan query straight to the gate; any other request through the whole stack."""
        plan = scope["type"] == "http" and scope.get("method") == "GET"
        if plan and plan_job(str(scope.get("path", ""))) is not None:
            gate = self._gate or self._find_gate()
            if gate is not None:
                if self.root_path:
                    scope["root_path"] = self.root_path
                scope["app"] = self
                await gate(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _find_gate(self) -> ASGIApp | None:
        """The gate in the built middleware stack (None: the stack has none)."""
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        layer: Any = self.middleware_stack
        for _ in range(32):
            if isinstance(layer, Gate):
                self._gate = layer
                return layer
            layer = getattr(layer, "app", None)
            if layer is None:
                break
        return None
