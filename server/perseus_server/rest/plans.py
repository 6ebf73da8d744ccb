"""Frontier and plan routes.

Compute, read, cancel and plot a job's time-energy frontier; query a plan by a policy of
:data:`perseus.policies.POLICIES` and deploy one. The policies' query parameters are built from that
registry.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from perseus.errors import OptionError
from perseus.plot import frontier_png
from perseus.policies import CRITERIA_FIRST, POLICIES, POLICY_NAMES, chosen
from perseus.power import SwingBounds
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.errors import BadRequest
from perseus_server.models.requests import PlanSelect, policy_field
from perseus_server.models.responses import FrontierStatus, PlanDeployment, PlanDoc
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import Gate
from perseus_server.service import PerseusService
from perseus_server.service.swing import SWING_FIELDS, swing_bounds, swing_items

__all__ = ["TAGS", "PlanAnswerFront", "PlanQueriesFirst", "plans_router"]

TAGS = [
    {"name": "frontier", "description": "The time-energy frontier, computed in the background."},
    {
        "name": "plans",
        "description": "Plans by a policy (deadline, slowdown, budgets, cost); deployment.",
    },
]


def _policy(given: Mapping[str, Any]) -> PlanPolicy:
    """The plan policy among the request's fields or query parameters (none: the fastest plan).

    A 422 naming the field for two policies, an option without its policy or a value out of
    bounds (:func:`perseus.policies.chosen`).
    """
    try:
        found = chosen(given)
    except OptionError as e:
        raise BadRequest(str(e), field=e.field) from None
    if found is None:
        return PlanPolicy()
    name, value, options = found
    return PlanPolicy(name, value, options=tuple(sorted(options.items())))


def _policy_query(**given: Any) -> dict[str, Any]:
    """The plan policies' query parameters.

    One per public parameter of :data:`perseus.policies.POLICIES` (the signature below is built
    from the registry).
    """
    return given


_policy_query.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=Query(None, **kw), annotation=t
        )
        for name, (t, kw) in {
            p.name: policy_field(p, query=True)
            for pol in POLICIES.values()
            for p in pol.parameters
            if p.public
        }.items()
    ]
)

_POLICY_QUERY = Depends(_policy_query)


def _swing_query(
    max_swing: float | None = Query(
        None,
        description="Bound the job's power swing, 1 - trough / peak (0-1): the answer is "
        "the plan and per-rank power_floors of least energy within the policy's deadline.",
    ),
    max_ramp: float | None = Query(
        None, description="Bound every change within ramp_window as a fraction of the peak (0-1)."
    ),
    ramp_window: float | None = Query(None, description="The ramp's window (s, default 0.1)."),
) -> SwingBounds | None:
    """The swing bounds among the query parameters (None: none asked)."""
    return swing_bounds({"max_swing": max_swing, "max_ramp": max_ramp, "ramp_window": ramp_window})


_SWING_QUERY = Depends(_swing_query)


def plans_router(service: PerseusService) -> APIRouter:
    """The frontier and plan routes over ``service``."""
    router = APIRouter()

    @router.post(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(
            FrontierStatus, "Compute the frontier", "The computation, queued.", 404, 409, status=202
        ),
    )
    async def start_frontier(job_id: str) -> dict[str, Any]:
        """Starts computing the job's time-energy frontier in a worker process.

        Poll ``GET /jobs/{id}/frontier``. When done, the fastest plan is deployed.
        """
        return service.solves.start(job_id)

    @router.get(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(FrontierStatus, "Get the frontier", "The computation and frontier.", 404, 422),
    )
    async def get_frontier(job_id: str, points: bool = True) -> dict[str, Any]:
        """The computation's progress and, once computed, every frontier point.

        ``points=false``: leave them out.
        """
        return service.frontier_status(job_id, points=points)

    @router.delete(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(
            FrontierStatus, "Cancel the computation", "The computation.", 404, 409, status=202
        ),
    )
    async def cancel_frontier(job_id: str) -> dict[str, Any]:
        """Stops a running frontier computation (409 when none runs)."""
        return service.solves.cancel(job_id)

    @router.get(
        "/jobs/{job_id}/frontier.png",
        tags=["frontier"],
        response_class=Response,
        **operation(
            None,
            "Plot the frontier",
            "A PNG plot.",
            404,
            409,
            content={"image/png": {"schema": {"type": "string", "format": "binary"}}},
        ),
    )
    async def frontier_plot(job_id: str) -> Response:
        """Energy against iteration time, the deployed points marked."""
        frontier, deployed = service.solves.frontier_of(job_id)
        marked = [(i, f"deployed: point {i}") for i in sorted(set(deployed))]
        png = await asyncio.to_thread(
            lambda: frontier_png(frontier.to_json(), marked=marked, title=f"job {job_id}")
        )
        return Response(png, media_type="image/png")

    @router.get(
        "/jobs/{job_id}/plan",
        tags=["plans"],
        **operation(PlanDoc, "Query a plan", "The selected frontier point.", 404, 409, 422),
    )
    async def get_plan(
        request: Request,
        job_id: str,
        given: dict[str, Any] = _POLICY_QUERY,
        steps: bool = Query(
            False,
            description="Include every rank's (instruction, microbatch, stage, frequency) list.",
        ),
        swing: SwingBounds | None = _SWING_QUERY,
    ) -> Response:
        """The plan one policy selects; deploys nothing.

        Give exactly one: the least-energy plan within a deadline, a slowdown or an energy
        budget, the fastest plan within a power budget (W, whole job; ties: least energy),
        Zeus's cost ``eta`` (``max_power``: one GPU's maximum power limit, default the
        job's), or a point by index. 422 when none fits (a power budget's names
        ``lowest_power``, W). With ``max_swing`` / ``max_ramp``: the plan and power floors of
        least energy within that policy's deadline meeting them (``power_floors``); a 422
        naming ``least_swing`` when none does.
        """
        policy = _policy(given)
        if all(given.get(name) is None for name in POLICY_NAMES):
            raise BadRequest(f"give one of {', '.join(CRITERIA_FIRST)}", field=CRITERIA_FIRST[0])
        # The bytes are kept under the raw query string: the same query again is answered by
        # PlanAnswerFront before routing (PlanDoc documents them).
        query = request.scope.get("query_string", b"")
        body = service.query_plan(job_id, policy, steps=steps, query=query, swing=swing)
        return Response(body, media_type="application/json")

    @router.put(
        "/jobs/{job_id}/plan",
        tags=["plans"],
        **operation(PlanDeployment, "Deploy a plan", "The new deployment.", 404, 409, 413, 422),
    )
    async def put_plan(job_id: str, body: PlanSelect) -> dict[str, Any] | None:
        """Sets the job's default policy or pins pipelines to a point; pushes the plans to ranks.

        The policy has at most one criterion (none: the fastest plan); pinning sets the
        given ``pipelines`` to the selected point.
        """
        given = body.model_dump(exclude={"pipelines"})
        swing = swing_bounds({k: given.pop(k) for k in SWING_FIELDS})
        policy = _policy(given)
        if swing is not None:
            if body.pipelines is not None:
                raise BadRequest(
                    "swing bounds are the whole job's: give no pipelines", field="max_swing"
                )
            policy = replace(policy, swing=swing_items(swing))
        return service.deploy(job_id, policy, body.pipelines)

    return router


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
