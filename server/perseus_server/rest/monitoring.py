"""The server's status routes: its liveness and its Prometheus metrics.

Liveness is ``/healthz``, public. A job's live status is a job route,
:mod:`perseus_server.rest.jobs`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import Field

from perseus_server.models.base import ResponseModel
from perseus_server.rest.docs import operation
from perseus_server.rest.gate import CALLER
from perseus_server.service import PerseusService
from perseus_server.service.authorization import JOB_READ, PUBLIC, allow, sees_tenant
from perseus_server.service.credentials import Principal

__all__ = ["TAG", "Health", "PrometheusText", "status_router"]

TAG = {"name": "service", "description": "Liveness and Prometheus metrics."}


class Health(ResponseModel):
    """``GET /healthz``."""

    status: Literal["ok"] = Field(description="Always ``ok`` while the server answers.")
    jobs: int = Field(description="Jobs the server holds.")
    uptime_seconds: float = Field(description="Seconds since the server started.")
    kernels: Literal["warming", "ready", "failed", "skipped"] = Field(
        description="The solver kernels' warm-up at start: ``warming`` (every other request is "
        "served; solves wait ``queued`` until it ends), ``ready`` (compiled or loaded), "
        "``failed`` (solves compile what they lack), ``skipped`` (``PERSEUS_WARM_KERNELS=0``)."
    )


class PrometheusText(PlainTextResponse):
    """The Prometheus text exposition format."""

    media_type = "text/plain; version=0.0.4"


def status_router(service: PerseusService) -> APIRouter:
    """The liveness and metrics routes over ``service``."""
    router = APIRouter()

    @router.get("/healthz", tags=["service"], **operation(Health, "Liveness", "OK.", public=True))
    @allow(PUBLIC)
    async def healthz() -> dict[str, Any]:
        """Whether the server answers; needs no token."""
        return service.health()

    @router.get(
        "/metrics",
        tags=["service"],
        response_class=PrometheusText,
        **operation(None, "Prometheus metrics", "Metrics in the Prometheus text format."),
    )
    @allow(JOB_READ)
    async def metrics(who: Principal = CALLER) -> PrometheusText:
        """Request, solve, deployment, replan and report counters and histograms; job gauges.

        A tenant's credential sees only the series of its jobs and its tenant.
        """
        return PrometheusText(service.metrics_text(sees_tenant(who)))

    return router
