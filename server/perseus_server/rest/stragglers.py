"""Straggler routes: report a slow pipeline, clear stragglers, set a job's straggler detection.

See :mod:`perseus_server.service.stragglers`. Each answers the job's status after replanning (or the
settings).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from perseus_server.decisions.detectors import DetectorSettings
from perseus_server.domain.errors import BadRequest
from perseus_server.models.base import INT32_MAX, Index
from perseus_server.rest.docs import built_response, operation
from perseus_server.rest.job_status import DetectionSettings, JobStatus
from perseus_server.service import PerseusService
from perseus_server.service.authorization import JOB_WRITE, allow

__all__ = ["TAG", "DetectionIn", "StragglerIn", "stragglers_router"]

TAG = {"name": "stragglers", "description": "Slow pipelines: reports, detection, replanning."}


# --- models ---------------------------------------------------------------------------------------


class StragglerIn(BaseModel):
    """``POST /jobs/{id}/stragglers``: a pipeline known to be slow."""

    model_config = ConfigDict(extra="forbid")
    pipeline: Index
    slowdown: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False, strict=True)] | None = None
    iteration_time: Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)] | None = None


class DetectionIn(BaseModel):
    """``PUT /jobs/{id}/straggler-detection``."""

    model_config = ConfigDict(extra="forbid")
    threshold: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False, strict=True)] = 0.05
    consecutive: Annotated[StrictInt, Field(ge=1, le=1000)] = 3
    recovery: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False, strict=True)] = 0.02


def stragglers_router(service: PerseusService) -> APIRouter:
    """The straggler routes over ``service``."""
    router = APIRouter(tags=["stragglers"])

    @router.post(
        "/jobs/{job_id}/stragglers",
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
    @allow(JOB_WRITE)
    async def report_straggler(job_id: str, body: StragglerIn) -> Response:
        """A pipeline known to be slow: the others move to the plan that finishes with it.

        Given by ``slowdown`` or ``iteration_time`` (s); the others' plan is the
        least-energy one that finishes with it.
        """
        status = service.report_straggler(job_id, body.pipeline, body.slowdown, body.iteration_time)
        return built_response(status, JobStatus)

    @router.delete(
        "/jobs/{job_id}/stragglers",
        **operation(
            JobStatus, "Clear stragglers", "The job's status after replanning.", 404, 409, 422
        ),
    )
    @allow(JOB_WRITE)
    async def clear_stragglers(
        job_id: str, pipeline: int | None = Query(None, ge=0, le=INT32_MAX)
    ) -> Response:
        """Forgets one pipeline's (or every) straggler and slow stages, and replans."""
        return built_response(service.clear_stragglers(job_id, pipeline), JobStatus)

    @router.put(
        "/jobs/{job_id}/straggler-detection",
        **operation(DetectionSettings, "Set straggler detection", "The settings.", 404, 413, 422),
    )
    @allow(JOB_WRITE)
    async def set_detection(job_id: str, body: DetectionIn) -> dict[str, Any]:
        """When a pipeline counts as slow and as recovered.

        Slow: ``threshold`` above plan for ``consecutive`` iterations; recovered: within
        ``recovery``.
        """
        if body.recovery >= body.threshold:
            raise BadRequest("recovery must be below threshold (hysteresis)", field="recovery")
        settings = DetectorSettings.from_json(body.model_dump())
        service.set_straggler_detection(job_id, settings)
        return settings.to_json()

    return router
