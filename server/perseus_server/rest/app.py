"""The REST application: one route per operation of :class:`PerseusService`.

Each route declares its response model (see :mod:`perseus_server.rest.docs`); FastAPI validates
the service's dict against it and serialises it, so ``/openapi.json`` documents what is sent.
``GET /jobs/{id}/plan`` is the exception: the service caches its body as bytes per frontier
point (the query benchmark's hot path), and it is sent as is; its model documents it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from perseus.plot import frontier_png
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.jobs import JobSpec
from perseus_server.models import (
    DetectionIn,
    DetectionSettings,
    FrontierStatus,
    Health,
    JobIn,
    JobList,
    JobStatus,
    JobView,
    PlanDeployment,
    PlanDoc,
    PlanSelect,
    ProfileDocument,
    ProfileSummary,
    ProfilingIn,
    ProfilingStatus,
    StragglerIn,
)
from perseus_server.models.credentials import JobCreated
from perseus_server.models.requests import INT32_MAX
from perseus_server.policy.detectors import DetectorSettings
from perseus_server.policy.planner import PlanPolicy
from perseus_server.rest.credentials import TAG as CREDENTIALS_TAG
from perseus_server.rest.credentials import create_job_with_credential, credentials_router
from perseus_server.rest.docs import install_openapi, operation
from perseus_server.rest.gate import Gate
from perseus_server.rest.power import TAG as POWER_TAG
from perseus_server.rest.power import power_router
from perseus_server.rest.problems import install_error_handlers
from perseus_server.rest.ui import install_ui
from perseus_server.service import PerseusService
from perseus_server.service.credentials import Credentials
from perseus_server.service.views import MAX_STATUS_RANKS, STATUS_RANKS

__all__ = ["create_app", "PrometheusText"]

TAGS = [
    {"name": "service", "description": "Liveness and Prometheus metrics."},
    {"name": "jobs", "description": "Training jobs and their live status."},
    {"name": "profiles", "description": "Per-stage time/energy profiles of a job."},
    {"name": "frontier", "description": "The time-energy frontier, computed in the background."},
    {"name": "plans", "description": "Plans by deadline, slowdown or energy budget; deployment."},
    {"name": "profiling", "description": "Online profiling: a scan of the SM clocks."},
    {"name": "stragglers", "description": "Slow pipelines: reports, detection, replanning."},
    POWER_TAG,
    CREDENTIALS_TAG,
]


class PrometheusText(PlainTextResponse):
    """The Prometheus text exposition format."""

    media_type = "text/plain; version=0.0.4"


def _policy(
    index: int | None,
    deadline: float | None,
    slowdown: float | None,
    energy_budget: float | None,
    power_budget: float | None = None,
) -> PlanPolicy:
    given = [
        (k, v)
        for k, v in (
            ("index", index),
            ("deadline", deadline),
            ("slowdown", slowdown),
            ("energy_budget", energy_budget),
            ("power_budget", power_budget),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise BadRequest(
            "give at most one of index, deadline, slowdown, energy_budget, power_budget",
            field=given[1][0],
        )
    if not given:
        return PlanPolicy()
    return PlanPolicy(given[0][0], float(given[0][1]))


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
        blocking_power=body.blocking_power,
        name=body.name,
    )


def create_app(
    service: PerseusService,
    *,
    token: str | None = None,
    credentials: Credentials | None = None,
    allowed_hosts: Sequence[str] = (),
) -> FastAPI:
    """The REST application over ``service`` (state is passed explicitly, no globals);
    ``credentials`` (default: just the admin ``token``, issued ones in ``service.store``);
    ``allowed_hosts``: host names an open server answers besides loopback ones."""
    credentials = credentials or Credentials(service.store, admin=token)
    app = FastAPI(
        title="Perseus",
        version="0.1.0",
        description="Energy scheduler for pipeline-parallel training: time-energy frontiers and "
        "per-instruction GPU frequency plans. Times are in seconds, energies in joules per "
        "iteration, powers in watts, clocks in MHz. Errors are RFC 9457 problem documents "
        "(`application/problem+json`) whose `field` names the input at fault. With a token "
        "configured, every route except `/healthz` needs `Authorization: Bearer <credential>`: "
        "the admin token opens everything, a read credential only GET routes (403 otherwise).",
        openapi_tags=TAGS,
    )
    app.add_middleware(
        Gate,
        credentials=credentials,
        limits=service.limits,
        metrics=service.metrics,
        allowed_hosts=allowed_hosts,
    )
    install_error_handlers(app)
    install_openapi(app)

    @app.get("/healthz", tags=["service"], **operation(Health, "Liveness", "OK.", public=True))
    async def healthz() -> dict[str, Any]:
        """Whether the server answers; needs no token."""
        return service.health()

    @app.get(
        "/metrics",
        tags=["service"],
        response_class=PrometheusText,
        **operation(None, "Prometheus metrics", "Metrics in the Prometheus text format."),
    )
    async def metrics() -> PrometheusText:
        """Request, solve, deployment, replan and report counters and histograms; job gauges."""
        return PrometheusText(service.metrics.render())

    # --- jobs ------------------------------------------------------------------------------------

    @app.post(
        "/jobs",
        tags=["jobs"],
        **operation(JobCreated, "Create a job", "The new job.", 409, 413, 422, status=201),
    )
    async def create_job(body: JobIn) -> dict[str, Any]:
        """A training job: pipelines of ``stages`` ranks running ``schedule`` over
        ``microbatches``; 409 when the server holds its maximum number of jobs."""
        return create_job_with_credential(service, credentials, _spec(body))

    @app.get("/jobs", tags=["jobs"], **operation(JobList, "List jobs", "A page of jobs.", 422))
    async def list_jobs(
        limit: int = Query(
            100, ge=1, le=service.limits.max_jobs_page, description="Jobs per page."
        ),
        after: str | None = Query(
            None, max_length=64, description="The ``next`` cursor of the previous page."
        ),
    ) -> dict[str, Any]:
        """The jobs, oldest first, a page at a time (``next`` is present when more follow);
        custom schedules are summarised by name, their orders are on ``GET /jobs/{id}``."""
        return service.jobs_page(limit, after)

    @app.get("/jobs/{job_id}", tags=["jobs"], **operation(JobView, "Get a job", "The job.", 404))
    async def get_job(job_id: str) -> dict[str, Any]:
        """A job's description, state, profile revision and deployed plan version."""
        return service.job_view(job_id)

    @app.delete(
        "/jobs/{job_id}",
        tags=["jobs"],
        response_class=Response,
        **operation(None, "Delete a job", "Deleted.", 404, status=204),
    )
    async def delete_job(job_id: str) -> Response:
        """Cancels its solves, ends its ranks' plan streams and deletes everything stored."""
        await service.delete_job(job_id)
        return Response(status_code=204)

    # --- profiles --------------------------------------------------------------------------------

    @app.put(
        "/jobs/{job_id}/profile",
        tags=["profiles"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "text/csv": {"schema": {"type": "string"}},
                    "application/json": {"schema": {"type": "object"}},
                },
            }
        },
        **operation(ProfileSummary, "Upload a profile", "The stored profile.", 404, 409, 413, 422),
    )
    async def put_profile(job_id: str, request: Request) -> dict[str, Any]:
        """``stage,instruction,frequency,time,energy`` CSV (seconds, joules, MHz) or its JSON
        form. It must cover the job's schedule and only use clocks the registered ranks
        support; a bad profile leaves the stored one in place (422 naming the row and field)."""
        service.job_view(job_id)  # 404 before reading the body
        body = await request.body()
        return await service.put_profile(job_id, body, request.headers.get("content-type", ""))

    @app.get(
        "/jobs/{job_id}/profile",
        tags=["profiles"],
        **operation(
            ProfileDocument,
            "Download the profile",
            "The profile: CSV, or JSON with ``format=json`` or ``Accept: application/json``.",
            404,
            422,
            content={"text/csv": {"schema": {"type": "string"}}},
        ),
    )
    async def get_profile(
        job_id: str, request: Request, format: str | None = Query(None, pattern="^(csv|json)$")
    ) -> Response:
        """The job's stored profile, uploaded or measured by online profiling."""
        profile = service.get_profile(job_id)
        want_json = format == "json" or (
            format is None and "application/json" in request.headers.get("accept", "")
        )
        if want_json:
            return JSONResponse(profile.to_json())
        return Response(profile.to_csv(), media_type="text/csv")

    # --- frontier --------------------------------------------------------------------------------

    @app.post(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(
            FrontierStatus, "Compute the frontier", "The computation, queued.", 404, 409, status=202
        ),
    )
    async def start_frontier(job_id: str) -> dict[str, Any]:
        """Starts computing the job's time-energy frontier in a worker process; poll
        ``GET /jobs/{id}/frontier``. When done, the fastest plan is deployed."""
        return service.start_frontier(job_id)

    @app.get(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(FrontierStatus, "Get the frontier", "The computation and frontier.", 404, 422),
    )
    async def get_frontier(job_id: str, points: bool = True) -> dict[str, Any]:
        """The computation's progress and, once computed, every frontier point (``points=false``:
        leave them out)."""
        return service.frontier_status(job_id, points=points)

    @app.delete(
        "/jobs/{job_id}/frontier",
        tags=["frontier"],
        **operation(
            FrontierStatus, "Cancel the computation", "The computation.", 404, 409, status=202
        ),
    )
    async def cancel_frontier(job_id: str) -> dict[str, Any]:
        """Stops a running frontier computation (409 when none runs)."""
        return service.cancel_frontier(job_id)

    @app.get(
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
        frontier, deployed = service.frontier_of(job_id)
        marked = [(i, f"deployed: point {i}") for i in sorted(set(deployed))]
        png = await asyncio.to_thread(
            lambda: frontier_png(frontier.to_json(), marked=marked, title=f"job {job_id}")
        )
        return Response(png, media_type="image/png")

    # --- plans -----------------------------------------------------------------------------------

    @app.get(
        "/jobs/{job_id}/plan",
        tags=["plans"],
        **operation(PlanDoc, "Query a plan", "The selected frontier point.", 404, 409, 422),
    )
    async def get_plan(
        job_id: str,
        deadline: float | None = Query(
            None, gt=0, allow_inf_nan=False, description="Iteration time limit (s)."
        ),
        slowdown: float | None = Query(
            None,
            ge=0,
            allow_inf_nan=False,
            description="Allowed slowdown vs max clocks (0.05 = 5 %).",
        ),
        energy_budget: float | None = Query(
            None, gt=0, allow_inf_nan=False, description="Energy per iteration limit (J)."
        ),
        index: int | None = Query(
            None, ge=0, le=INT32_MAX, description="A frontier point by index."
        ),
        power_budget: float | None = Query(
            None,
            gt=0,
            allow_inf_nan=False,
            description="Average power limit (W, whole job): the fastest plan within it.",
        ),
        steps: bool = Query(
            False,
            description="Include every rank's (instruction, microbatch, stage, frequency) list.",
        ),
    ) -> Response:
        """The least-energy plan within a deadline, a slowdown or an energy budget, the fastest
        plan within a power budget (W, whole job; ties: least energy), or a point by index
        (give exactly one); 422 when none fits (a power budget's names ``lowest_power``, W).
        Deploys nothing."""
        if all(v is None for v in (deadline, slowdown, energy_budget, index, power_budget)):
            raise BadRequest(
                "give one of deadline, slowdown, energy_budget, power_budget, index",
                field="deadline",
            )
        policy = _policy(index, deadline, slowdown, energy_budget, power_budget)
        # The service's cached bytes, sent as they are (the hot path; PlanDoc documents them).
        return Response(
            service.query_plan(job_id, policy, steps=steps), media_type="application/json"
        )

    @app.put(
        "/jobs/{job_id}/plan",
        tags=["plans"],
        **operation(PlanDeployment, "Deploy a plan", "The new deployment.", 404, 409, 413, 422),
    )
    async def put_plan(job_id: str, body: PlanSelect) -> dict[str, Any] | None:
        """Sets the job's default policy (at most one criterion; none: the fastest plan), or
        pins the given ``pipelines`` to the selected point, and pushes the plans to the ranks."""
        policy = _policy(
            body.index, body.deadline, body.slowdown, body.energy_budget, body.power_budget
        )
        return service.deploy(job_id, policy, body.pipelines)

    @app.get(
        "/jobs/{job_id}/status",
        tags=["jobs"],
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
    ) -> dict[str, Any]:
        """Ranks (registered, connected, last report), the deployment, the frontier computation,
        each pipeline's recent iterations, stragglers and slow stages, and profiling. Ranks'
        detail comes a page at a time (``ranks`` per page, by global rank; ``ranks_next``
        names the next page's ``after``), so a status costs the same at any world size."""
        return service.status(job_id, ranks, after)

    # --- online profiling ------------------------------------------------------------------------

    @app.post(
        "/jobs/{job_id}/profiling",
        tags=["profiling"],
        **operation(
            ProfilingStatus, "Start online profiling", "The scan.", 404, 409, 413, 422, status=202
        ),
    )
    async def start_profiling(job_id: str, body: ProfilingIn) -> dict[str, Any]:
        """Scans the SM clocks from the highest down, one plan version per clock, measuring the
        job's own profile from its ranks' reports; then computes and deploys its frontier."""
        return service.start_profiling(
            job_id,
            body.frequencies,
            body.warmup_iterations,
            body.iterations_per_frequency,
            body.stop_after_rises,
            body.tolerance,
        )

    @app.get(
        "/jobs/{job_id}/profiling",
        tags=["profiling"],
        **operation(ProfilingStatus, "Profiling progress", "The scan.", 404),
    )
    async def get_profiling(job_id: str) -> dict[str, Any]:
        """The scan's clock, measured iterations and energy per clock (404: never started)."""
        return service.profiling_status(job_id)

    @app.delete(
        "/jobs/{job_id}/profiling",
        tags=["profiling"],
        **operation(ProfilingStatus, "Abort online profiling", "The aborted scan.", 404, 409),
    )
    async def abort_profiling(job_id: str) -> dict[str, Any]:
        """Stops a running scan; the ranks go back to the previous plan (or max clocks)."""
        return service.abort_profiling(job_id)

    # --- stragglers ------------------------------------------------------------------------------

    @app.post(
        "/jobs/{job_id}/stragglers",
        tags=["stragglers"],
        **operation(
            JobStatus,
            "Report a straggler",
            "The job's status after replanning.",
            404,
            409,
            413,
            422,
        ),
    )
    async def report_straggler(job_id: str, body: StragglerIn) -> dict[str, Any]:
        """A pipeline known to be slow (by ``slowdown`` or ``iteration_time``, s): the others
        move to the least-energy plan that finishes with it."""
        return service.report_straggler(job_id, body.pipeline, body.slowdown, body.iteration_time)

    @app.delete(
        "/jobs/{job_id}/stragglers",
        tags=["stragglers"],
        **operation(
            JobStatus, "Clear stragglers", "The job's status after replanning.", 404, 409, 422
        ),
    )
    async def clear_stragglers(
        job_id: str, pipeline: int | None = Query(None, ge=0, le=INT32_MAX)
    ) -> dict[str, Any]:
        """Forgets one pipeline's (or every) straggler and slow stages, and replans."""
        return service.clear_stragglers(job_id, pipeline)

    @app.put(
        "/jobs/{job_id}/straggler-detection",
        tags=["stragglers"],
        **operation(DetectionSettings, "Set straggler detection", "The settings.", 404, 413, 422),
    )
    async def set_detection(job_id: str, body: DetectionIn) -> dict[str, Any]:
        """When a pipeline counts as slow (``threshold`` above plan for ``consecutive``
        iterations) and as recovered (within ``recovery``)."""
        if body.recovery >= body.threshold:
            raise BadRequest("recovery must be below threshold (hysteresis)", field="recovery")
        settings = DetectorSettings(body.threshold, body.consecutive, body.recovery)
        service.set_detector(job_id, settings)
        return settings.to_json()

    app.include_router(power_router(service))
    app.include_router(credentials_router(service, credentials))
    install_ui(app, auth=credentials.enabled)  # the page's own middleware: keep it added last
    return app
