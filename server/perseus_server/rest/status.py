"""Status routes: the server's liveness (``/healthz``, public) and Prometheus metrics, and a job's
live status (ranks, deployment, iterations, stragglers, profiling), a page of ranks at a time."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse, Response

from perseus_server.models import Health, JobStatus
from perseus_server.models.requests import INT32_MAX
from perseus_server.rest.docs import built_response, operation
from perseus_server.service import PerseusService
from perseus_server.service.views import MAX_STATUS_RANKS, STATUS_RANKS

__all__ = ["TAG", "PrometheusText", "status_router"]

TAG = {"name": "service", "description": "Liveness and Prometheus metrics."}


class PrometheusText(PlainTextResponse):
    """The Prometheus text exposition format."""

    media_type = "text/plain; version=0.0.4"


def status_router(service: PerseusService) -> APIRouter:
    """The liveness, metrics and job status routes over ``service``."""
    router = APIRouter()

    @router.get("/healthz", tags=["service"], **operation(Health, "Liveness", "OK.", public=True))
    async def healthz() -> dict[str, Any]:
        """Whether the server answers; needs no token."""
        return service.views.health()

    @router.get(
        "/metrics",
        tags=["service"],
        response_class=PrometheusText,
        **operation(None, "Prometheus metrics", "Metrics in the Prometheus text format."),
    )
    async def metrics() -> PrometheusText:
        """Request, solve, deployment, replan and report counters and histograms; job gauges."""
        return PrometheusText(service.metrics.render())

    @router.get(
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

    return router
