"""Job routes: create (with its rank credential), list, get, its live status, finish, delete.

Also how a request's job description becomes a :class:`~perseus_server.domain.jobs.JobSpec`
(schedule, blocking power from the known GPUs).

Routers are included in an order that declares ``/jobs`` before the paths under it (the OpenAPI
document lists paths in that order; schemathesis infers its stateful links from it).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from perseus_common.gpus import KNOWN_GPUS
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.jobs import JobSpec
from perseus_server.models import JobIn, JobList, JobStatus, JobView
from perseus_server.models.credentials import JobCreated
from perseus_server.models.requests import INT32_MAX
from perseus_server.models.responses import LifecycleView
from perseus_server.rest.credentials import create_job_with_credential
from perseus_server.rest.docs import built_response, operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import TENANT_SCOPES, sees_tenant
from perseus_server.service.credentials import Credentials, Principal
from perseus_server.service.tenants import DEFAULT_TENANT
from perseus_server.service.views import MAX_STATUS_RANKS, STATUS_RANKS

__all__ = ["TAG", "jobs_router"]

TAG = {"name": "jobs", "description": "Training jobs and their live status."}

#: Why a job needs its GPU's blocking power, and how to measure it (two refusals say it).
_MEASURE_IT = (
    "Measure it as the power draw during a blocking receive (e.g. `nvidia-smi "
    "--query-gpu=power.draw --format=csv -lms 100` while a rank waits in recv), or give "
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
    if tenant not in service.tenants:
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
        return create_job_with_credential(service, credentials, spec, tenant)

    @router.get("/jobs", **operation(JobList, "List jobs", "A page of jobs.", 422))
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
    async def get_job(job_id: str) -> dict[str, Any]:
        """A job's description, state, profile revision and deployed plan version."""
        return service.views.job(job_id)

    @router.get(
        "/jobs/{job_id}/status",
        **operation(JobStatus, "Job status", "The job's live state.", 404),
    )
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
        return built_response(service.views.status(job_id, ranks, after), JobStatus)

    @router.post(
        "/jobs/{job_id}/finish",
        **operation(LifecycleView, "Finish a job", "The job's lifecycle.", 404, 409),
    )
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
    async def delete_job(job_id: str) -> Response:
        """Cancels its solves, ends its ranks' plan streams and deletes everything stored."""
        await service.delete_job(job_id)
        return Response(status_code=204)

    return router
