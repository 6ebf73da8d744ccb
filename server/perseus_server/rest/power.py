"""``/power-budget``: one power cap (W) over several jobs.

Each job's plan is deployed from its share (see :mod:`perseus_server.service.power_budget`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from perseus_server.models import PowerBudgetIn, PowerBudgetView
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import sees_tenant
from perseus_server.service.credentials import Principal

__all__ = ["TAG", "power_router"]

TAG = {"name": "power", "description": "A power budget (W) shared by several jobs."}


def power_router(service: PerseusService) -> APIRouter:
    """The routes of the cluster power budget over ``service``."""
    router = APIRouter(tags=["power"])

    @router.put(
        "/power-budget",
        **operation(
            PowerBudgetView, "Set the power budget", "The budget and its allocation.", 413, 422
        ),
    )
    async def put_power_budget(body: PowerBudgetIn) -> dict[str, Any]:
        """Shares ``watts`` (W) between the covered jobs by ``policy`` and deploys each job's plan.

        The covered jobs are ``jobs``, or every job with a frontier. A budget that is not a
        finite number > 0, names an unknown job or one without a frontier, or is below the
        lowest power the jobs can reach (``lowest_power``, W) is refused with 422 and
        changes nothing. Only active jobs share it (idle and finished ones are left out);
        when it can no longer be met (a job joined), ``on_infeasible`` says what runs.
        """
        return service.power_budget.put(body.watts, body.policy, body.jobs, body.on_infeasible)

    @router.get(
        "/power-budget",
        **operation(PowerBudgetView, "Get the power budget", "The budget and its allocation.", 404),
    )
    async def get_power_budget(who: Principal = CALLER) -> dict[str, Any]:
        """The budget (W), the allocated watts and each job's share.

        Each share: watts, slowdown and frontier point (404 when no budget is set). A
        tenant's credential sees the cluster's totals and its own jobs' and tenant's shares
        only.
        """
        return service.power_budget.view(sees_tenant(who))

    @router.delete(
        "/power-budget",
        response_class=Response,
        **operation(None, "Remove the power budget", "Removed.", 404, status=204),
    )
    async def delete_power_budget() -> Response:
        """Every covered job goes back to its own plan policy (404 when none is set)."""
        service.power_budget.delete()
        return Response(status_code=204)

    return router
