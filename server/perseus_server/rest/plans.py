"""Frontier and plan routes.

Compute, read, cancel and plot a job's time-energy frontier; query a plan by a policy of
:data:`perseus.policies.POLICIES` and deploy one. The policies' query parameters are built from that
registry; the request's fields go to the service as they are, which reads the policy from them
(:mod:`perseus_server.service.plans`). A repeated plan query is answered before routing
(:mod:`perseus_server.rest.plan_fast_path`).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from perseus.plot import frontier_png
from perseus.policies import POLICIES
from perseus.power import SwingBounds
from perseus_server.models.requests import PlanSelect, policy_field
from perseus_server.models.responses import FrontierStatus, PlanDeployment, PlanDoc
from perseus_server.rest.docs import operation
from perseus_server.service import PerseusService
from perseus_server.service.authorization import JOB_READ, JOB_WRITE, allow
from perseus_server.service.swing import swing_bounds

__all__ = ["TAGS", "plans_router"]

TAGS = [
    {"name": "frontier", "description": "The time-energy frontier, computed in the background."},
    {
        "name": "plans",
        "description": "Plans by a policy (deadline, slowdown, budgets, cost); deployment.",
    },
]


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
    _frontier_routes(router, service)
    _plan_routes(router, service)
    return router


def _frontier_routes(router: APIRouter, service: PerseusService) -> None:
    """Compute, read, cancel and plot a job's frontier."""

    @router.post(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(
            FrontierStatus, "Compute the frontier", "The computation, queued.", 404, 409, status=202
        ),
    )
    @allow(JOB_WRITE)
    async def start_frontier(job_id: str) -> dict[str, Any]:
        """Starts computing the job's time-energy frontier in a worker process.

        Poll ``GET /jobs/{id}/frontier``. When done, the fastest plan is deployed.
        """
        return service.start_solve(job_id)

    @router.get(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(FrontierStatus, "Get the frontier", "The computation and frontier.", 404, 422),
    )
    @allow(JOB_READ)
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
    @allow(JOB_WRITE)
    async def cancel_frontier(job_id: str) -> dict[str, Any]:
        """Stops a running frontier computation (409 when none runs)."""
        return service.cancel_solve(job_id)

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
    @allow(JOB_READ)
    async def frontier_plot(job_id: str) -> Response:
        """Energy against iteration time, the deployed points marked."""
        frontier, deployed = service.frontier_of(job_id)
        marked = [(i, f"deployed: point {i}") for i in sorted(set(deployed))]
        png = await asyncio.to_thread(
            lambda: frontier_png(frontier.to_json(), marked=marked, title=f"job {job_id}")
        )
        return Response(png, media_type="image/png")


def _plan_routes(router: APIRouter, service: PerseusService) -> None:
    """Query a plan by a policy; deploy one."""

    @router.get(
        "/jobs/{job_id}/plan",
        tags=["plans"],
        **operation(PlanDoc, "Query a plan", "The selected frontier point.", 404, 409, 422),
    )
    @allow(JOB_READ)
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
        # The bytes are kept under the raw query string: the same query again is answered by
        # PlanAnswerFront before routing (PlanDoc documents them).
        query = request.scope.get("query_string", b"")
        body = service.query_plan(job_id, given, steps=steps, query=query, swing=swing)
        return Response(body, media_type="application/json")

    @router.put(
        "/jobs/{job_id}/plan",
        tags=["plans"],
        **operation(PlanDeployment, "Deploy a plan", "The new deployment.", 404, 409, 413, 422),
    )
    @allow(JOB_WRITE)
    async def put_plan(job_id: str, body: PlanSelect) -> dict[str, Any] | None:
        """Sets the job's default policy or pins pipelines to a point; pushes the plans to ranks.

        The policy has at most one criterion (none: the fastest plan); pinning sets the
        given ``pipelines`` to the selected point.
        """
        return service.deploy(job_id, body.model_dump(exclude={"pipelines"}), body.pipelines)
