"""Profile routes: upload and download a job's profile, and online profiling.

An upload may take some of the profile's stages. Online profiling is the scan of the SM clocks that
measures a profile from the ranks' reports.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from perseus.errors import ProfileError
from perseus.profiles import parse_profile_csv, parse_profile_json, parse_stage_list
from perseus_common.clocks import MAX_CLOCK_MHZ
from perseus_common.profile_csv import load_json
from perseus_server.domain.errors import BadRequest
from perseus_server.models.base import ResponseModel
from perseus_server.models.status import ProfilingStatus
from perseus_server.rest.docs import operation
from perseus_server.service import PerseusService
from perseus_server.service.authorization import JOB_READ, JOB_WRITE, allow

__all__ = [
    "TAGS",
    "ProfileDocument",
    "ProfileRecord",
    "ProfileSummary",
    "ProfilingIn",
    "profiles_router",
]

TAGS = [
    {"name": "profiles", "description": "Per-stage time/energy profiles of a job."},
    {"name": "profiling", "description": "Online profiling: a scan of the SM clocks."},
]


# --- models ---------------------------------------------------------------------------------------

Clock = Annotated[StrictInt, Field(ge=1, le=MAX_CLOCK_MHZ)]


class ProfileSummary(ResponseModel):
    """A stored profile, summarised."""

    revision: int = Field(description="Increases with every stored profile of the job.")
    source: str = Field(description="``upload`` or ``online profiling``.")
    stages: int = Field(description="Stages the profile covers.")
    instructions: list[str] = Field(description="Instruction kinds the profile covers.")
    frequencies: list[int] = Field(description="Every measured SM clock (MHz), decreasing.")
    rows: int = Field(description="Measurements: (stage, instruction, frequency) rows.")


class ProfileRecord(ResponseModel):
    """One measurement of a profile."""

    stage: int
    instruction: str
    frequency: int = Field(description="SM clock (MHz).")
    time: float = Field(description="Seconds the instruction takes at this clock.")
    energy: float = Field(description="Joules the instruction uses at this clock.")


class ProfileDocument(ResponseModel):
    """A profile as JSON (``GET /jobs/{id}/profile?format=json``)."""

    format: Literal["perseus-profile/1"]
    records: list[ProfileRecord]


class ProfilingIn(BaseModel):
    """``POST /jobs/{id}/profiling``."""

    model_config = ConfigDict(extra="forbid")
    frequencies: list[Clock] | None = Field(
        default=None,
        max_length=1024,
        description="Clocks to scan (MHz); default: every clock all registered ranks support.",
    )
    warmup_iterations: Annotated[StrictInt, Field(ge=0, le=1000)] = Field(
        default=2, description="Iterations at each new clock that are not measured."
    )
    iterations_per_frequency: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        default=5,
        description="The most measured iterations per rank at a clock (fewer once every "
        "instruction's mean time and energy are known within ``tolerance``).",
    )
    stop_after_rises: Annotated[StrictInt, Field(ge=1, le=1000)] = Field(
        default=3,
        description="Per instruction: how many clocks in a row its effective cost must rise "
        "beyond the noise, after its lowest point, before the scan may stop.",
    )
    tolerance: Annotated[float, Field(ge=0, le=0.5, allow_inf_nan=False, strict=True)] = Field(
        default=0.01,
        description="Relative standard error at which a clock's means are known: a clock is "
        "finished once every instruction's mean time and energy are known within it (from at "
        "least two samples), else after ``iterations_per_frequency``. 0: always measure "
        "``iterations_per_frequency`` iterations and do not measure the fastest clocks again "
        "after the scan.",
    )


def _select_stages(body: bytes, content_type: str, stages: str, limit: int) -> bytes:
    """``PUT /jobs/{id}/profile?stages=0-3``: the profile's ``stages`` only, as CSV.

    Renumbered from 0 (as ``perseus frontier --profile-stages``). A list naming more than
    ``limit`` stages (the job's model stages: the profile must have as many) is refused before
    it is built.
    """
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


def profiles_router(service: PerseusService) -> APIRouter:
    """The profile and online-profiling routes over ``service``."""
    router = APIRouter()

    @router.put(
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
    @allow(JOB_WRITE)
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
        """Upload the job's profile: ``stage,instruction,frequency,time,energy`` CSV, or JSON.

        The JSON is the CSV's JSON form.

        The CSV is in seconds, joules and MHz. It must cover the job's schedule and only use
        clocks the registered ranks support; a bad profile leaves the stored one in place
        (422 naming the row and field). ``stages`` selects some of the profile's stages (as
        ``perseus frontier --profile-stages``).
        """
        model_stages = service.job_stages(job_id)  # 404 before the body
        body = await request.body()
        content_type = request.headers.get("content-type", "")
        if stages is not None:
            body = await asyncio.to_thread(_select_stages, body, content_type, stages, model_stages)
            content_type = "text/csv"
        return await service.put_profile(job_id, body, content_type)

    @router.get(
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
    @allow(JOB_READ)
    async def get_profile(
        job_id: str, request: Request, format: str | None = Query(None, pattern="^(csv|json)$")
    ) -> Response:
        """The job's stored profile, uploaded or measured by online profiling."""
        profile = service.profile(job_id)
        want_json = format == "json" or (
            format is None and "application/json" in request.headers.get("accept", "")
        )
        if want_json:
            return JSONResponse(profile.to_json())
        return Response(profile.to_csv(), media_type="text/csv")

    @router.post(
        "/jobs/{job_id}/profiling",
        tags=["profiling"],
        **operation(
            ProfilingStatus, "Start online profiling", "The scan.", 404, 409, 413, 422, status=202
        ),
    )
    @allow(JOB_WRITE)
    async def start_profiling(job_id: str, body: ProfilingIn) -> dict[str, Any]:
        """Scans the SM clocks from the highest down, measuring the job's own profile.

        One plan version per clock, measured from its ranks' reports; then computes and
        deploys its frontier.
        """
        return service.start_profiling(
            job_id,
            body.frequencies,
            body.warmup_iterations,
            body.iterations_per_frequency,
            body.stop_after_rises,
            body.tolerance,
        )

    @router.get(
        "/jobs/{job_id}/profiling",
        tags=["profiling"],
        **operation(ProfilingStatus, "Profiling progress", "The scan.", 404),
    )
    @allow(JOB_READ)
    async def get_profiling(job_id: str) -> dict[str, Any]:
        """The scan's clock, measured iterations and energy per clock (404: never started)."""
        return service.profiling_status(job_id)

    @router.delete(
        "/jobs/{job_id}/profiling",
        tags=["profiling"],
        **operation(ProfilingStatus, "Abort online profiling", "The aborted scan.", 404, 409),
    )
    @allow(JOB_WRITE)
    async def abort_profiling(job_id: str) -> dict[str, Any]:
        """Stops a running scan; the ranks go back to the previous plan (or max clocks)."""
        return service.abort_profiling(job_id)

    return router
