"""The REST application: one route per operation of :class:`PerseusService`.

Each route declares its response model (see :mod:`perseus_server.rest.docs`); FastAPI validates
the service's dict against it and serialises it, so ``/openapi.json`` documents what is sent.
``GET /jobs/{id}/plan`` is the exception: the service caches its body as bytes per frontier
point (the query benchmark's hot path), and it is sent as is; its model documents it. The job
status (``GET /jobs/{id}/status`` and the straggler routes that answer it) is encoded as the
service built it, without the model's validation (:func:`~perseus_server.rest.docs.built_response`).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from perseus.errors import OptionError, ProfileError
from perseus.plot import frontier_png
from perseus.policies import CRITERIA_FIRST, POLICIES, POLICY_NAMES, chosen
from perseus.profiles import parse_profile_csv, parse_profile_json, parse_stage_list
from perseus_common.gpus import KNOWN_GPUS
from perseus_common.profile_csv import load_json
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
from perseus_server.models.requests import INT32_MAX, policy_field
from perseus_server.models.responses import LifecycleView
from perseus_server.policy.detectors import DetectorSettings
from perseus_server.policy.planner import PlanPolicy
from perseus_server.rest.credentials import TAG as CREDENTIALS_TAG
from perseus_server.rest.credentials import create_job_with_credential, credentials_router
from perseus_server.rest.docs import built_response, install_openapi, operation
from perseus_server.rest.gate import Gate
from perseus_server.rest.power import TAG as POWER_TAG
from perseus_server.rest.power import power_router
from perseus_server.rest.problems import install_error_handlers
from perseus_server.rest.swagger import install_swagger
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
    {
        "name": "plans",
        "description": "Plans by a policy (deadline, slowdown, budgets, cost); deployment.",
    },
    {"name": "profiling", "description": "Online profiling: a scan of the SM clocks."},
    {"name": "stragglers", "description": "Slow pipelines: reports, detection, replanning."},
    POWER_TAG,
    CREDENTIALS_TAG,
]


class PrometheusText(PlainTextResponse):
    """The Prometheus text exposition format."""

    media_type = "text/plain; version=0.0.4"


def _policy(given: Mapping[str, Any]) -> PlanPolicy:
    """The plan policy among the request's fields or query parameters (none: the fastest
    plan); a 422 naming the field for two policies, an option without its policy or a value
    out of bounds (:func:`perseus.policies.chosen`)."""
    try:
        found = chosen(given)
    except OptionError as e:
        raise BadRequest(str(e), field=e.field) from None
    if found is None:
        return PlanPolicy()
    name, value, options = found
    return PlanPolicy(name, value, options=tuple(sorted(options.items())))


def _policy_query(**given: Any) -> dict[str, Any]:
    """The plan policies' query parameters, one per public parameter of
    :data:`perseus.policies.POLICIES` (the signature below is built from the registry)."""
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


def _known_gpu(model: str) -> float | None:
    """The table's blocking power for a GPU model (``A100``, ``NVIDIA A40``...), or None."""
    words = "".join(c if c.isalnum() else " " for c in model.lower()).split()
    found = {g.blocking_power for g in KNOWN_GPUS if g.key in words}
    return found.pop() if len(found) == 1 else None


def _blocking_power(gpu_model: str, given: float | None) -> float:
    """``blocking_power`` as given, else the known GPU's; a GPU the table does not know needs
    it (422 saying how to measure it), never a silent 0 W."""
    if given is not None:
        return given
    if not gpu_model.strip():
        return 0.0  # neither given: the create route refuses it once the rest is checked
    known = _known_gpu(gpu_model)
    if known is None:
        names = ", ".join(g.name for g in KNOWN_GPUS)
        raise BadRequest(
            f"gpu_model {gpu_model[:64]!r} is not a GPU whose blocking power is known ({names}): "
            "give blocking_power, the watts one GPU draws while it waits on a pipeline neighbour. "
            "Measure it as the power draw during a blocking receive (e.g. `nvidia-smi "
            "--query-gpu=power.draw --format=csv -lms 100` while a rank waits in recv), or give "
            "blocking_power 0 now and run online profiling (POST /jobs/{id}/profiling), which "
            "measures it",
            field="blocking_power",
        )
    return known


def _select_stages(body: bytes, content_type: str, stages: str, limit: int) -> bytes:
    """``PUT /jobs/{id}/profile?stages=0-3``: the profile's ``stages`` only, renumbered from 0
    (as ``perseus frontier --profile-stages``), as CSV. A list naming more than ``limit``
    stages (the job's model stages: the profile must have as many) is refused before it is
    built."""
    try:
        chosen = parse_stage_list(stages, limit)
    except ProfileError as e:
        raise BadRequest(str(e), field="stages") from None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8 text", field="profile") from None
    try:
        if "json" in content_type or text.lstrip().startswith(("{", "[")):
            profile = parse_profile_json(load_json(text))
        else:
            profile = parse_profile_csv(text)
    except ProfileError as e:
        raise BadRequest(str(e), field=f"profile.{e.field}" if e.field else "profile") from None
    except ValueError as e:
        raise BadRequest(str(e), field="profile") from None
    try:
        return profile.select_stages(chosen).to_csv().encode()
    except ProfileError as e:
        raise BadRequest(str(e), field="stages") from None


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
        # /docs and /openapi.json are served by rest/swagger.py (offline, outside the gate)
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
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
        return service.views.health()

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
        spec = _spec(body)
        if body.blocking_power is None and not body.gpu_model.strip():
            spec.validate(service.limits)  # a bad field elsewhere is named first
            raise BadRequest(
                "give blocking_power (W), the power one GPU draws while it waits on a pipeline "
                "neighbour, or a gpu_model whose blocking power is known ("
                + ", ".join(g.name for g in KNOWN_GPUS)
                + "): it prices every idle second of a plan. Measure it as the power draw "
                "during a blocking receive (e.g. `nvidia-smi --query-gpu=power.draw "
                "--format=csv -lms 100` while a rank waits in recv), or give blocking_power 0 "
                "and run online profiling (POST /jobs/{id}/profiling), which measures it",
                field="blocking_power",
            )
        return create_job_with_credential(service, credentials, spec)

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
        return service.views.job(job_id)

    @app.post(
        "/jobs/{job_id}/finish",
        tags=["jobs"],
        **operation(LifecycleView, "Finish a job", "The job's lifecycle.", 404, 409),
    )
    async def finish_job(job_id: str) -> dict[str, Any]:
        """The job is done: it leaves the cluster power budget at once (the others share it
        again) and stays stored (``DELETE`` removes it). 409 when already finished; a rank
        that connects again makes it active."""
        return service.finish_job(job_id)

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
    async def put_profile(
        job_id: str,
        request: Request,
        stages: str | None = Query(
            None,
            max_length=1000,
            description="Use only these stages of the profile, renumbered from 0 (``0-3``, "
            "``0,2,4``): e.g. an 8-stage profile for a 4-rank job.",
        ),
    ) -> dict[str, Any]:
        """``stage,instruction,frequency,time,energy`` CSV (seconds, joules, MHz) or its JSON
        form. It must cover the job's schedule and only use clocks the registered ranks
        support; a bad profile leaves the stored one in place (422 naming the row and field).
        ``stages`` selects some of the profile's stages (as ``perseus frontier
        --profile-stages``)."""
        model_stages = service.jobs.get(job_id).schedule.stages  # 404 before the body
        body = await request.body()
        content_type = request.headers.get("content-type", "")
        if stages is not None:
            body = await asyncio.to_thread(_select_stages, body, content_type, stages, model_stages)
            content_type = "text/csv"
        return await service.profiles.put(job_id, body, content_type)

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
        profile = service.profiles.get(job_id)
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
        return service.solves.start(job_id)

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
        return service.solves.cancel(job_id)

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
        frontier, deployed = service.solves.frontier_of(job_id)
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
        given: dict[str, Any] = _POLICY_QUERY,
        steps: bool = Query(
            False,
            description="Include every rank's (instruction, microbatch, stage, frequency) list.",
        ),
    ) -> Response:
        """The plan one policy selects (give exactly one: the least-energy plan within a
        deadline, a slowdown or an energy budget, the fastest plan within a power budget (W,
        whole job; ties: least energy), Zeus's cost ``eta`` (``max_power``: one GPU's maximum
        power limit, default the job's), or a point by index); 422 when none fits (a power
        budget's names ``lowest_power``, W). Deploys nothing."""
        policy = _policy(given)
        if all(given.get(name) is None for name in POLICY_NAMES):
            raise BadRequest(f"give one of {', '.join(CRITERIA_FIRST)}", field=CRITERIA_FIRST[0])
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
        policy = _policy(body.model_dump(exclude={"pipelines"}))
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
    ) -> Response:
        """Ranks (registered, connected, last report), the deployment, the frontier computation,
        each pipeline's recent iterations, stragglers and slow stages, and profiling. Ranks'
        detail comes a page at a time (``ranks`` per page, by global rank; ``ranks_next``
        names the next page's ``after``), so a status costs the same at any world size."""
        return built_response(service.views.status(job_id, ranks, after), JobStatus)

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
        return service.profiling.start(
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
        return service.profiling.status(job_id)

    @app.delete(
        "/jobs/{job_id}/profiling",
        tags=["profiling"],
        **operation(ProfilingStatus, "Abort online profiling", "The aborted scan.", 404, 409),
    )
    async def abort_profiling(job_id: str) -> dict[str, Any]:
        """Stops a running scan; the ranks go back to the previous plan (or max clocks)."""
        return service.profiling.abort(job_id)

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
    async def report_straggler(job_id: str, body: StragglerIn) -> Response:
        """A pipeline known to be slow (by ``slowdown`` or ``iteration_time``, s): the others
        move to the least-energy plan that finishes with it."""
        status = service.report_straggler(job_id, body.pipeline, body.slowdown, body.iteration_time)
        return built_response(status, JobStatus)

    @app.delete(
        "/jobs/{job_id}/stragglers",
        tags=["stragglers"],
        **operation(
            JobStatus, "Clear stragglers", "The job's status after replanning.", 404, 409, 422
        ),
    )
    async def clear_stragglers(
        job_id: str, pipeline: int | None = Query(None, ge=0, le=INT32_MAX)
    ) -> Response:
        """Forgets one pipeline's (or every) straggler and slow stages, and replans."""
        return built_response(service.clear_stragglers(job_id, pipeline), JobStatus)

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
        settings = DetectorSettings.from_json(body.model_dump())
        service.stragglers.set_detector(job_id, settings)
        return settings.to_json()

    app.include_router(power_router(service))
    app.include_router(credentials_router(service, credentials))
    install_swagger(app)  # /docs and /openapi.json, outside the gate
    install_ui(app, auth=credentials.enabled)  # the page's own middleware: keep it added last
    return app
