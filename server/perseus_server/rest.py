"""The REST API (FastAPI): jobs, profiles, frontiers, plans, profiling, stragglers, status.

Errors are RFC 9457 problem documents (``application/problem+json``) with a ``field`` naming the
input at fault. With a token configured every route except ``/healthz`` needs
``Authorization: Bearer <token>``. Bodies are capped (see :class:`~perseus_server.config.Limits`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perseus.plot import frontier_png
from perseus_server.config import Limits
from perseus_server.errors import ApiError, BadRequest, TooLarge, Unauthorized
from perseus_server.jobs import JobSpec
from perseus_server.metrics import Metrics
from perseus_server.models import DetectionIn, JobIn, PlanSelect, ProfilingIn, StragglerIn
from perseus_server.planner import PlanPolicy
from perseus_server.service import PerseusService
from perseus_server.stragglers import DetectorSettings

__all__ = ["create_app"]

PROBLEM = "application/problem+json"


def _problem(err: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.problem(), status_code=err.status, media_type=PROBLEM, headers=headers)


class Gate:
    """Pure ASGI middleware: bearer-token check, body-size cap, request metrics."""

    def __init__(
        self, app: ASGIApp, *, token: str | None, limits: Limits, metrics: Metrics
    ) -> None:
        self.app, self.token, self.limits, self.metrics = app, token, limits, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._handle(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.request_latency.observe(
                time.perf_counter() - t0, route=path, method=method
            )
            self.metrics.requests.inc(route=path, method=method, status=str(status[0]))

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        if self.token is not None and scope["path"] != "/healthz":
            auth = headers.get("authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(
                given.strip().encode(), self.token.encode()
            ):
                err = Unauthorized("missing or wrong bearer token", field="Authorization")
                await _problem(err, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        is_profile = scope.get("method") == "PUT" and scope["path"].endswith("/profile")
        limit = self.limits.max_profile_bytes if is_profile else self.limits.max_body_bytes
        length = headers.get("content-length")
        too_large = TooLarge(
            f"the body exceeds the limit of {limit} bytes", field="body", limit=limit
        )
        if length is not None:
            if not length.isdigit() or int(length) > limit:
                await _problem(too_large)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if headers.get("transfer-encoding", "").lower() != "chunked":
            await self.app(scope, receive, send)
            return
        # Chunked body: read it here, bounded, then replay it to the app.
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await _problem(too_large)(scope, receive, send)
                return
            if not msg.get("more_body"):
                break
        replayed = [False]

        async def replay() -> Message:
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _field_of(loc: tuple[Any, ...], kind: str = "") -> str:
    if kind == "json_invalid":
        return "body"
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    # Drop pydantic's union-member tags (``ScheduleIn``, ``literal['a','b']``, ``function-after[...]``).
    parts = [p for p in parts if not (p[:1].isupper() or "[" in p or "'" in p)]
    return ".".join(parts) or "body"


def _policy(
    index: int | None, deadline: float | None, slowdown: float | None, energy_budget: float | None
) -> PlanPolicy:
    given = [
        (k, v)
        for k, v in (
            ("index", index),
            ("deadline", deadline),
            ("slowdown", slowdown),
            ("energy_budget", energy_budget),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise BadRequest(
            "give at most one of index, deadline, slowdown, energy_budget", field=given[1][0]
        )
    if not given:
        return PlanPolicy()
    return PlanPolicy(given[0][0], float(given[0][1]))


def create_app(service: PerseusService, *, token: str | None = None) -> FastAPI:
    """The REST application over ``service`` (state is passed explicitly, no globals)."""
    app = FastAPI(
        title="Perseus",
        version="0.1.0",
        description="Energy scheduler for pipeline-parallel training: time-energy frontiers and "
        "per-instruction GPU frequency plans.",
    )
    app.add_middleware(Gate, token=token, limits=service.limits, metrics=service.metrics)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _problem(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        field = _field_of(tuple(first.get("loc", ("body",))), str(first.get("type", "")))
        detail = f"{field}: {first.get('msg', 'invalid')}"
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more)"
        err = BadRequest(
            detail,
            field=field,
            errors=[
                {
                    "field": _field_of(tuple(e.get("loc", ())), str(e.get("type", ""))),
                    "message": str(e.get("msg", "")),
                }
                for e in errors[:20]
            ],
        )
        return _problem(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = ApiError(str(exc.detail), field="path" if exc.status_code == 404 else None)
        err.status = exc.status_code
        err.title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "Error")
        return _problem(err, dict(exc.headers or {}))

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, Any]:
        return service.health()

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    # --- jobs ------------------------------------------------------------------------------------

    @app.post("/jobs", status_code=201, tags=["jobs"])
    async def create_job(body: JobIn) -> dict[str, Any]:
        name: str
        if isinstance(body.schedule, str):
            name, vs, orders = body.schedule, body.virtual_stages or 1, None
        else:
            name, orders = body.schedule.name, body.schedule.orders
            vs = body.virtual_stages or body.schedule.virtual_stages
            if name == "custom" and orders is None:
                raise BadRequest("a custom schedule needs 'orders'", field="schedule.orders")
            if name != "custom" and orders is not None:
                raise BadRequest(
                    "'orders' is only allowed with name 'custom'", field="schedule.orders"
                )
        spec = JobSpec(
            stages=body.stages,
            microbatches=body.microbatches,
            schedule=name,
            virtual_stages=vs,
            orders=None
            if orders is None
            else tuple(tuple((k, m, s) for k, m, s in o) for o in orders),
            data_parallel=body.data_parallel,
            tensor_parallel=body.tensor_parallel,
            gpu_model=body.gpu_model,
            blocking_power=body.blocking_power,
            name=body.name,
        )
        return service.create_job(spec)

    @app.get("/jobs", tags=["jobs"])
    async def list_jobs() -> dict[str, Any]:
        return {"jobs": service.list_jobs()}

    @app.get("/jobs/{job_id}", tags=["jobs"])
    async def get_job(job_id: str) -> dict[str, Any]:
        return service.job_view(job_id)

    @app.delete("/jobs/{job_id}", status_code=204, tags=["jobs"])
    async def delete_job(job_id: str) -> Response:
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
    )
    async def put_profile(job_id: str, request: Request) -> dict[str, Any]:
        service.job_view(job_id)  # 404 before reading the body
        body = await request.body()
        return await service.put_profile(job_id, body, request.headers.get("content-type", ""))

    @app.get(
        "/jobs/{job_id}/profile",
        tags=["profiles"],
        responses={200: {"content": {"text/csv": {}, "application/json": {}}}},
    )
    async def get_profile(
        job_id: str, request: Request, format: str | None = Query(None, pattern="^(csv|json)$")
    ) -> Response:
        profile = service.get_profile(job_id)
        want_json = format == "json" or (
            format is None and "application/json" in request.headers.get("accept", "")
        )
        if want_json:
            return JSONResponse(profile.to_json())
        return Response(profile.to_csv(), media_type="text/csv")

    # --- frontier --------------------------------------------------------------------------------

    @app.post("/jobs/{job_id}/frontier", status_code=202, tags=["frontier"])
    async def start_frontier(job_id: str) -> dict[str, Any]:
        return service.start_frontier(job_id)

    @app.get("/jobs/{job_id}/frontier", tags=["frontier"])
    async def get_frontier(job_id: str, points: bool = True) -> dict[str, Any]:
        return service.frontier_status(job_id, points=points)

    @app.delete("/jobs/{job_id}/frontier", status_code=202, tags=["frontier"])
    async def cancel_frontier(job_id: str) -> dict[str, Any]:
        return service.cancel_frontier(job_id)

    @app.get(
        "/jobs/{job_id}/frontier.png",
        tags=["frontier"],
        response_class=Response,
        responses={200: {"content": {"image/png": {}}}},
    )
    async def frontier_plot(job_id: str) -> Response:
        frontier, deployed = service.frontier_of(job_id)
        marked = [(i, f"deployed: point {i}") for i in sorted(set(deployed))]
        png = await asyncio.to_thread(
            lambda: frontier_png(frontier.to_json(), marked=marked, title=f"job {job_id}")
        )
        return Response(png, media_type="image/png")

    # --- plans -----------------------------------------------------------------------------------

    @app.get("/jobs/{job_id}/plan", tags=["plans"])
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
        index: int | None = Query(None, ge=0, description="A frontier point by index."),
        steps: bool = Query(
            False,
            description="Include every rank's (instruction, microbatch, stage, frequency) list.",
        ),
    ) -> Response:
        if all(v is None for v in (deadline, slowdown, energy_budget, index)):
            raise BadRequest(
                "give one of deadline, slowdown, energy_budget, index", field="deadline"
            )
        policy = _policy(index, deadline, slowdown, energy_budget)
        return Response(
            service.query_plan(job_id, policy, steps=steps), media_type="application/json"
        )

    @app.put("/jobs/{job_id}/plan", tags=["plans"])
    async def put_plan(job_id: str, body: PlanSelect) -> dict[str, Any] | None:
        policy = _policy(body.index, body.deadline, body.slowdown, body.energy_budget)
        return service.deploy(job_id, policy, body.pipelines)

    @app.get("/jobs/{job_id}/status", tags=["jobs"])
    async def status(job_id: str) -> dict[str, Any]:
        return service.status(job_id)

    # --- online profiling ------------------------------------------------------------------------

    @app.post("/jobs/{job_id}/profiling", status_code=202, tags=["profiling"])
    async def start_profiling(job_id: str, body: ProfilingIn) -> dict[str, Any]:
        return service.start_profiling(
            job_id,
            body.frequencies,
            body.warmup_iterations,
            body.iterations_per_frequency,
            body.stop_after_rises,
        )

    @app.get("/jobs/{job_id}/profiling", tags=["profiling"])
    async def get_profiling(job_id: str) -> dict[str, Any]:
        return service.profiling_status(job_id)

    @app.delete("/jobs/{job_id}/profiling", tags=["profiling"])
    async def abort_profiling(job_id: str) -> dict[str, Any]:
        return service.abort_profiling(job_id)

    # --- stragglers ------------------------------------------------------------------------------

    @app.post("/jobs/{job_id}/stragglers", tags=["stragglers"])
    async def report_straggler(job_id: str, body: StragglerIn) -> dict[str, Any]:
        return service.report_straggler(job_id, body.pipeline, body.slowdown, body.iteration_time)

    @app.delete("/jobs/{job_id}/stragglers", tags=["stragglers"])
    async def clear_stragglers(
        job_id: str, pipeline: int | None = Query(None, ge=0)
    ) -> dict[str, Any]:
        return service.clear_stragglers(job_id, pipeline)

    @app.put("/jobs/{job_id}/straggler-detection", tags=["stragglers"])
    async def set_detection(job_id: str, body: DetectionIn) -> dict[str, Any]:
        if body.recovery >= body.threshold:
            raise BadRequest("recovery must be below threshold (hysteresis)", field="recovery")
        settings = DetectorSettings(body.threshold, body.consecutive, body.recovery)
        service.set_detector(job_id, settings)
        return settings.to_json()

    return app
