"""``/power-budget``: one power cap (W) over several jobs.

Each job's plan is deployed from its share (see :mod:`perseus_server.service.power_budget`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from perseus_server.models.base import ResponseModel
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import ADMIN_ONLY, JOB_READ, allow, sees_tenant
from perseus_server.service.credentials import Principal

__all__ = [
    "TAG",
    "JobPowerBudget",
    "PowerBudgetIn",
    "PowerBudgetView",
    "PowerShareView",
    "power_router",
]

TAG = {"name": "power", "description": "A power budget (W) shared by several jobs."}


# --- models ---------------------------------------------------------------------------------------

JobId = Annotated[str, Field(min_length=1, max_length=200)]


class PowerBudgetIn(BaseModel):
    """``PUT /power-budget``: one cap (W) over several jobs."""

    model_config = ConfigDict(extra="forbid")
    watts: Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)] = Field(
        description="The budget (W), all covered jobs' average power together."
    )
    policy: Literal["throughput", "fair"] = Field(
        default="throughput",
        description="``throughput``: least GPU-time lost (slowdown x GPUs, summed); ``fair``: "
        "least largest slowdown.",
    )
    jobs: list[JobId] | None = Field(
        default=None,
        max_length=10_000,
        description="The jobs it covers; default: every job with a frontier, later ones included.",
    )
    on_infeasible: Literal["least_power", "keep_current"] = Field(
        default="least_power",
        description="What runs when the budget can no longer be met (a job joined): "
        "``least_power``: every covered job its least-power plan; ``keep_current``: the plans of "
        "the last feasible allocation (a job without one: its least-power plan).",
    )


class PowerShareView(ResponseModel):
    """One job's share of the budget."""

    id: str = Field(description="The job's ID.")
    watts: float = Field(description="Its average power (W, whole job) at its point.")
    slowdown: float = Field(
        description="Its slowdown against max clocks, or against its straggler's time (0.05 = 5 %)."
    )
    point: int = Field(description="The frontier point it runs.")
    time: float = Field(description="Its iteration time (s) at that point.")


class LeftOutJob(ResponseModel):
    """A job the budget leaves out."""

    job: str = Field(description="The job's ID.")
    why: str = Field(description="Why it takes no share.")


class TenantShareView(ResponseModel):
    """One tenant's part of the budget."""

    tenant: str = Field(description="The tenant.")
    watts: float = Field(description="Its part (W): guaranteed watts, then shared by weight.")
    allocated_watts: float = Field(description="What its jobs' shares sum to (W).")
    demand_watts: float = Field(
        description="What its drawing jobs could use at their fastest plans (W, claims bounded "
        "by their GPUs)."
    )
    guaranteed_watts: float = Field(description="Its guaranteed watts (0: none).")


class PowerBudgetView(ResponseModel):
    """``GET /power-budget``: the budget and its allocation."""

    watts: float = Field(description="The budget (W).")
    policy: Literal["throughput", "fair"]
    allocated_watts: float = Field(
        description="The shares' sum (W), at most the budget if feasible."
    )
    feasible: bool = Field(
        description="false when the covered jobs cannot get under the budget (a job joined "
        "after it was set): ``on_infeasible`` says what runs then."
    )
    lowest_power: float = Field(description="The least the covered jobs can draw together (W).")
    covers: list[str] | None = Field(description="The jobs it was set for, or null: every job.")
    gap: float | None = Field(
        description="The allocation's distance from the optimum (0: exact), null when infeasible."
    )
    on_infeasible: Literal["least_power", "keep_current"] = Field(
        description="What runs when the budget cannot be met."
    )
    over_by: float = Field(
        description="How far the covered jobs' lowest power is above the budget (W; 0 when met)."
    )
    left_out: list[LeftOutJob] = Field(
        description="Jobs it would cover that do not draw (idle, finished, or no rank "
        "connected): they take no share."
    )
    jobs: list[PowerShareView] = Field(description="One share per drawing job.")
    tenants: list[TenantShareView] = Field(
        description="Each drawing tenant's part (a tenant's credential: its own)."
    )


class JobPowerBudget(ResponseModel):
    """A job's share of the cluster power budget (in its status)."""

    budget: float = Field(description="The cluster budget (W).")
    policy: Literal["throughput", "fair"]
    watts: float = Field(description="This job's share (W, average power of the whole job).")
    slowdown: float = Field(description="Its slowdown under the budget (0.05 = 5 %).")
    point: int = Field(description="The frontier point it runs.")
    feasible: bool = Field(description="Whether the budget is met.")
    on_infeasible: Literal["least_power", "keep_current"] = Field(
        description="What runs when the budget cannot be met."
    )
    claim: str | None = Field(
        description="Why its plans' powers were bounded by what its GPUs can draw, or null."
    )


class JobPowerDraw(ResponseModel):
    """What a job draws on a cluster power budget (in its status), and why."""

    pipelines_counted: int = Field(
        description="Its pipelines whose every rank is connected: only they count toward its "
        "claim and demand (0: it draws nothing)."
    )
    pipelines: int = Field(description="Its pipelines (data_parallel).")
    ranks_per_pipeline: int = Field(description="The ranks one pipeline needs (stages x tp).")
    why: str = Field(
        description="Why it draws what it draws, e.g. 'pipeline 1 has 3 of 4 ranks "
        "connected: not counted'."
    )


def power_router(service: PerseusService) -> APIRouter:
    """The routes of the cluster power budget over ``service``."""
    router = APIRouter(tags=["power"])

    @router.put(
        "/power-budget",
        **operation(
            PowerBudgetView, "Set the power budget", "The budget and its allocation.", 413, 422
        ),
    )
    @allow(ADMIN_ONLY)
    async def put_power_budget(body: PowerBudgetIn) -> dict[str, Any]:
        """Shares ``watts`` (W) between the covered jobs by ``policy`` and deploys each job's plan.

        The covered jobs are ``jobs``, or every job with a frontier. A budget that is not a
        finite number > 0, names an unknown job or one without a frontier, or is below the
        lowest power the jobs can reach (``lowest_power``, W) is refused with 422 and
        changes nothing. Only active jobs share it (idle and finished ones are left out);
        when it can no longer be met (a job joined), ``on_infeasible`` says what runs.
        """
        return service.set_power_budget(body.watts, body.policy, body.jobs, body.on_infeasible)

    @router.get(
        "/power-budget",
        **operation(PowerBudgetView, "Get the power budget", "The budget and its allocation.", 404),
    )
    @allow(JOB_READ)
    async def get_power_budget(who: Principal = CALLER) -> dict[str, Any]:
        """The budget (W), the allocated watts and each job's share.

        Each share: watts, slowdown and frontier point (404 when no budget is set). A
        tenant's credential sees the cluster's totals and its own jobs' and tenant's shares
        only.
        """
        return service.power_budget_view(sees_tenant(who))

    @router.delete(
        "/power-budget",
        response_class=Response,
        **operation(None, "Remove the power budget", "Removed.", 404, status=204),
    )
    @allow(ADMIN_ONLY)
    async def delete_power_budget() -> Response:
        """Every covered job goes back to its own plan policy (404 when none is set)."""
        service.delete_power_budget()
        return Response(status_code=204)

    return router
