"""Job routes: create (with its rank credential), list, get, its live status, finish, delete.

Also their request and response models, and how a request's job description becomes a
:class:`~perseus_server.domain.jobs.JobSpec` (schedule, blocking power from the known GPUs). The
schedule names come from their one table (:data:`perseus.schedules.SCHEDULE_NAMES`).

Routers are included in an order that declares ``/jobs`` before the paths under it (the OpenAPI
document lists paths in that order; schemathesis infers its stateful links from it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from perseus.schedules import SCHEDULE_NAMES
from perseus_common.gpus import KNOWN_GPUS
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.states import JobState
from perseus_server.models.base import INT32_MAX, Index, ResponseModel, Timestamp, omitted
from perseus_server.models.responses import FrontierState
from perseus_server.rest.docs import built_response, operation
from perseus_server.rest.gate import CALLER
from perseus_server.rest.job_status import JobStatus, LifecycleView
from perseus_server.service import PerseusService
from perseus_server.service.authorization import (
    JOB_READ,
    JOB_STATUS,
    JOB_WRITE,
    TENANT_SCOPES,
    allow,
    sees_tenant,
)
from perseus_server.service.credentials import Credentials, Principal
from perseus_server.service.tenants import DEFAULT_TENANT
from perseus_server.service.views import MAX_STATUS_RANKS, STATUS_RANKS

__all__ = [
    "TAG",
    "CustomScheduleSummary",
    "CustomScheduleView",
    "JobCreated",
    "JobIn",
    "JobList",
    "JobSummary",
    "JobView",
    "NamedScheduleView",
    "ProfileRef",
    "ScheduleIn",
    "ScheduleName",
    "jobs_router",
]

TAG = {"name": "jobs", "description": "Training jobs and their live status."}

#: Why a job needs its GPU's blocking power, and how to measure it (two refusals say it).
_MEASURE_IT = (
    "Measure it as the power draw during a blocking receive (e.g. `nvidia-smi "
    "--query-gpu=power.draw --format=csv -lms 100` while a rank waits in recv), or give "
)


# --- models ---------------------------------------------------------------------------------------

if TYPE_CHECKING:
    ScheduleName = str
else:
    #: A built-in schedule's name.
    ScheduleName = Literal[SCHEDULE_NAMES]

Count = Annotated[StrictInt, Field(ge=1, le=1_000_000)]

Watts = Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False, strict=True)]

OrderOp = tuple[Annotated[str, Field(max_length=64)], Index, Index]


class ScheduleIn(BaseModel):
    """A named schedule, or an explicit per-rank order (``name: custom`` with ``orders``)."""

    model_config = ConfigDict(extra="forbid")
    name: ScheduleName | Literal["custom"] = "1f1b"
    virtual_stages: Annotated[StrictInt, Field(ge=1, le=1024)] = 1
    orders: list[list[OrderOp]] | None = Field(
        default=None,
        description="Per rank, the ops it runs in order: [instruction, microbatch, stage].",
    )


class JobIn(BaseModel):
    """``POST /jobs``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=200)
    tenant: str | None = Field(
        default=None,
        max_length=63,
        description="The tenant the job belongs to. The admin may name any (default: "
        "``default``); a tenant credential's jobs are its tenant's (naming another is refused).",
    )
    stages: Count = Field(description="Pipeline ranks per pipeline.")
    microbatches: Count
    schedule: ScheduleIn | ScheduleName = "1f1b"
    virtual_stages: Annotated[StrictInt, Field(ge=1, le=1024)] | None = None
    data_parallel: Count = 1
    tensor_parallel: Count = 1
    gpu_model: str = Field(default="", max_length=200)
    blocking_power: Watts | None = Field(
        default=None,
        description="Watts a GPU draws while waiting on a pipeline neighbour. Omitted: the "
        "table's value for a known ``gpu_model`` (A100, A40); for a ``gpu_model`` the table does "
        "not know it must be given (measure it: the GPU's power draw during a blocking receive, "
        "e.g. ``nvidia-smi --query-gpu=power.draw``, or run online profiling, which measures "
        "it); 0 when neither is given.",
    )


class NamedScheduleView(ResponseModel):
    """A built-in schedule."""

    name: ScheduleName
    virtual_stages: int = Field(description="Model chunks per rank (interleaved schedules).")


class CustomScheduleView(ResponseModel):
    """An explicit per-rank order."""

    name: Literal["custom"]
    orders: list[list[tuple[str, int, int]]] = Field(
        description="Per rank, the ops it runs in order: [instruction, microbatch, stage]."
    )


class CustomScheduleSummary(ResponseModel):
    """An explicit per-rank order, summarised (``GET /jobs/{id}`` has the orders)."""

    name: Literal["custom"]


class ProfileRef(ResponseModel):
    """Which profile a job holds."""

    revision: int = Field(description="Increases with every stored profile of the job.")
    source: str = Field(description="``upload`` or ``online profiling``.")


class JobView(ResponseModel):
    """A job: its description and where it stands."""

    id: str = Field(description="The job's ID (path parameter ``job_id``).")
    created: Timestamp
    tenant: str = Field(
        description="The tenant (team) the job belongs to (``default``: none named)."
    )
    state: JobState = Field(
        description="created -> profiled (profile stored) -> solving -> ready (frontier computed); "
        "profiling while an online scan runs; failed when the last computation failed."
    )
    name: str
    stages: int = Field(description="Pipeline ranks per pipeline.")
    microbatches: int = Field(description="Microbatches per iteration.")
    schedule: NamedScheduleView | CustomScheduleView
    data_parallel: int = Field(description="Data-parallel pipelines.")
    tensor_parallel: int = Field(description="GPUs per pipeline rank.")
    gpu_model: str
    blocking_power: float = Field(description="Watts a GPU draws while waiting.")
    instructions: int = Field(description="Instructions per pipeline and iteration.")
    world_size: int = Field(description="stages x data_parallel x tensor_parallel ranks.")
    profile: ProfileRef | None = Field(description="The stored profile, or null.")
    frontier_status: FrontierState
    plan_version: int = Field(description="The deployed plan version (0: nothing deployed).")
    lifecycle: LifecycleView


class JobSummary(ResponseModel):
    """A job in the list: :class:`JobView` without a custom schedule's orders."""

    id: str = Field(description="The job's ID (path parameter ``job_id``).")
    created: Timestamp
    tenant: str = Field(description="The tenant (team) the job belongs to.")
    state: JobState
    name: str
    stages: int
    microbatches: int
    schedule: NamedScheduleView | CustomScheduleSummary
    data_parallel: int
    tensor_parallel: int
    gpu_model: str
    blocking_power: float
    instructions: int
    world_size: int
    profile: ProfileRef | None
    frontier_status: FrontierState
    plan_version: int
    lifecycle: LifecycleView


class JobList(ResponseModel):
    """``GET /jobs``: a page of jobs, oldest first."""

    jobs: list[JobSummary]
    next: str = omitted("Present when more jobs follow: pass it as ``after`` to get the next page.")


class JobCreated(JobView):
    """A new job; with a token configured, also its rank credential (shown only here)."""

    rank_credential: str = omitted(
        "The job's rank credential (bearer token of its ranks' gRPC calls), present when the "
        "server has a token. Shown once: only its SHA-256 is stored; rotate it to get a new one."
    )


def _spec(body: JobIn) -> JobSpec:
    name: str
    if isinstance(body.schedule, str):
        name, vs, orders = body.schedule, body.virtual_stages or 1, None
    else:
        name, orders = body.schedule.name, body.schedule.orders
        vs = body.virtual_stages or body.schedule.virtual_stages
        if name == "custom" and orders is None:
            raise BadRequest("a custom schedule needs 'orders'", field="schedule.orders")
        if name != "custom" and orders is not None:
            raise BadRequest("'orders' is only allowed with name 'custom'", field="schedule.orders")
    return JobSpec(
        stages=body.stages,
        microbatches=body.microbatches,
        schedule=name,
        virtual_stages=vs,
        orders=None if orders is None else tuple(tuple((k, m, s) for k, m, s in o) for o in orders),
        data_parallel=body.data_parallel,
        tensor_parallel=body.tensor_parallel,
        gpu_model=body.gpu_model,
        blocking_power=_blocking_power(body.gpu_model, body.blocking_power),
        name=body.name,
    )


def _job_tenant(who: Principal, named: str | None, service: PerseusService) -> str:
    """The tenant a new job belongs to.

    A tenant credential's own (naming another is refused), else the one named (an unknown one is
    refused), else ``default``.
    """
    if who.scope in TENANT_SCOPES:
        assert who.tenant is not None
        if named is not None and named != who.tenant:
            raise BadRequest(
                f"a credential of tenant {who.tenant!r} creates jobs in its own tenant",
                field="tenant",
            )
        return who.tenant
    tenant = DEFAULT_TENANT if named is None else named
    if not service.has_tenant(tenant):
        raise BadRequest(f"no tenant {tenant[:64]!r}; POST /tenants first", field="tenant")
    return tenant


def _known_gpu(model: str) -> float | None:
    """The table's blocking power for a GPU model (``A100``, ``NVIDIA A40``...), or None."""
    words = "".join(c if c.isalnum() else " " for c in model.lower()).split()
    found = {g.blocking_power for g in KNOWN_GPUS if g.key in words}
    return found.pop() if len(found) == 1 else None


def _blocking_power(gpu_model: str, given: float | None) -> float:
    """``blocking_power`` as given, else the known GPU's.

    A GPU the table does not know needs it (422 saying how to measure it), never a silent 0 W.
    """
    if given is not None:
        words = "".join(c if c.isalnum() else " " for c in gpu_model.lower()).split()
        for g in KNOWN_GPUS:
            if g.key in words and given > g.max_power_limit:
                raise BadRequest(
                    f"{given:g} W is more than a {g.name} can draw (its maximum power limit is "
                    f"{g.max_power_limit:g} W): give the power one GPU draws while it waits on a "
                    "pipeline neighbour",
                    field="blocking_power",
                )
        return given
    if not gpu_model.strip():
        return 0.0  # neither given: the create route refuses it once the rest is checked
    known = _known_gpu(gpu_model)
    if known is None:
        names = ", ".join(g.name for g in KNOWN_GPUS)
        raise BadRequest(
            f"gpu_model {gpu_model[:64]!r} is not a GPU whose blocking power is known ({names}): "
            "give blocking_power, the watts one GPU draws while it waits on a pipeline neighbour. "
            + _MEASURE_IT
            + "blocking_power 0 now and run online profiling (POST /jobs/{id}/profiling), which "
            "measures it",
            field="blocking_power",
        )
    return known


def jobs_router(service: PerseusService, credentials: Credentials) -> APIRouter:
    """The job routes over ``service`` (a new job's rank credential from ``credentials``)."""
    router = APIRouter(tags=["jobs"])

    @router.post(
        "/jobs", **operation(JobCreated, "Create a job", "The new job.", 409, 413, 422, status=201)
    )
    @allow(JOB_WRITE)
    async def create_job(body: JobIn, who: Principal = CALLER) -> dict[str, Any]:
        """A training job: pipelines of ``stages`` ranks running ``schedule`` over ``microbatches``.

        In the caller's tenant (the admin: ``tenant``, default ``default``); 409 when the
        server holds its maximum number of jobs, or the tenant its quota.
        """
        tenant = _job_tenant(who, body.tenant, service)
        spec = _spec(body)
        if body.blocking_power is None and not body.gpu_model.strip():
            spec.validate(service.limits)  # a bad field elsewhere is named first
            raise BadRequest(
                "give blocking_power (W), the power one GPU draws while it waits on a pipeline "
                "neighbour, or a gpu_model whose blocking power is known ("
                + ", ".join(g.name for g in KNOWN_GPUS)
                + "): it prices every idle second of a plan. "
                + _MEASURE_IT
                + "blocking_power 0 and run online profiling (POST /jobs/{id}/profiling), which "
                "measures it",
                field="blocking_power",
            )
        return service.create_job(spec, tenant, credentials)

    @router.get("/jobs", **operation(JobList, "List jobs", "A page of jobs.", 422))
    @allow(JOB_READ)
    async def list_jobs(
        limit: int = Query(
            100, ge=1, le=service.limits.max_jobs_page, description="Jobs per page."
        ),
        after: str | None = Query(
            None, max_length=64, description="The ``next`` cursor of the previous page."
        ),
        who: Principal = CALLER,
    ) -> dict[str, Any]:
        """The jobs, oldest first, a page at a time (``next`` is present when more follow).

        Custom schedules are summarised by name, their orders are on ``GET /jobs/{id}``. A
        tenant's credential lists its tenant's jobs only.
        """
        return service.jobs_page(limit, after, sees_tenant(who))

    @router.get("/jobs/{job_id}", **operation(JobView, "Get a job", "The job.", 404))
    @allow(JOB_READ)
    async def get_job(job_id: str) -> dict[str, Any]:
        """A job's description, state, profile revision and deployed plan version."""
        return service.job(job_id)

    @router.get(
        "/jobs/{job_id}/status",
        **operation(JobStatus, "Job status", "The job's live state.", 404),
    )
    @allow(JOB_STATUS)
    async def status(
        job_id: str,
        ranks: int = Query(
            STATUS_RANKS,
            ge=0,
            le=MAX_STATUS_RANKS,
            description="How many ranks' detail to list (0: none; the counts are always there).",
        ),
        after: int | None = Query(
            None,
            ge=-1,
            le=INT32_MAX,
            description="List ranks after this global rank (the "
            "``ranks_next`` of the previous page).",
        ),
    ) -> Response:
        """The job's live status: ranks, deployment, frontier, iterations, stragglers and profiling.

        Ranks (registered, connected, last report), the deployment, the frontier
        computation, each pipeline's recent iterations, stragglers and slow stages, and
        profiling. Ranks' detail comes a page at a time (``ranks`` per page, by global rank;
        ``ranks_next`` names the next page's ``after``), so a status costs the same at any
        world size.
        """
        return built_response(service.status(job_id, ranks, after), JobStatus)

    @router.post(
        "/jobs/{job_id}/finish",
        **operation(LifecycleView, "Finish a job", "The job's lifecycle.", 404, 409),
    )
    @allow(JOB_WRITE)
    async def finish_job(job_id: str) -> dict[str, Any]:
        """The job is done: it leaves the cluster power budget at once and stays stored.

        The others share the budget again; ``DELETE`` removes the job. 409 when already
        finished; a rank that connects again makes it active.
        """
        return service.finish_job(job_id)

    @router.delete(
        "/jobs/{job_id}",
        response_class=Response,
        **operation(None, "Delete a job", "Deleted.", 404, status=204),
    )
    @allow(JOB_WRITE)
    async def delete_job(job_id: str) -> Response:
        """Cancels its solves, ends its ranks' plan streams and deletes everything stored."""
        await service.delete_job(job_id)
        return Response(status_code=204)

    return router
