"""A job's profile: uploaded (CSV or JSON) or measured online, validated and stored.

It is validated against the job's schedule and its ranks' supported clocks, and stored with a
revision number.
"""

from __future__ import annotations

from typing import Any

from perseus.profiles import Profile
from perseus_server.domain.errors import BadRequest, Conflict, NotFound
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import ProfilingStatus
from perseus_server.runtime.parse_pool import ParsePool
from perseus_server.service.context import ServiceContext
from perseus_server.service.state import Job

__all__ = ["Profiles", "check_clocks"]

_NO_PROFILE = "the job has no profile yet; PUT /jobs/{id}/profile or run online profiling"


def rank_stages(job: Job, profile: Profile, pipeline_rank: int) -> set[int]:
    """Profile stages a rank runs (model stages, or the rank itself for a per-rank profile)."""
    if profile.stages == job.schedule.ranks:
        return {pipeline_rank}
    return {op.stage for op in job.schedule.orders[pipeline_rank]}


def check_clocks(job: Job, profile: Profile, ranks: list[RankInfo]) -> None:
    """Every frequency the profile uses on a rank's stages must be one the rank supports."""
    for r in ranks:
        if not r.supported_clocks:
            continue
        supported = set(r.supported_clocks)
        stages = rank_stages(job, profile, r.pipeline_rank)
        for (s, _), p in profile.entries.items():
            if s in stages:
                bad = sorted({int(f) for f in p.frequencies} - supported)
                if bad:
                    raise BadRequest(
                        f"stage {s} uses {bad[:5]} MHz, which rank {r.global_rank} "
                        f"({r.gpu_name or 'its GPU'}) does not support",
                        field="profile.frequency",
                    )


class Profiles:
    """Upload, storage and summary of job profiles."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.pool = ParsePool()

    async def put(self, job_id: str, body: bytes, content_type: str) -> dict[str, Any]:
        """``PUT /jobs/{id}/profile``: parse, check and store the body as the job's new profile.

        Refused with 409 while a frontier computation runs; returns the profile's summary.
        """
        job = self.ctx.jobs.get(job_id)
        if self.ctx.solver.is_active(job_id):
            raise Conflict(
                "a frontier computation is running; cancel it (DELETE /jobs/{id}/frontier) first",
                field="profile",
            )
        if job.profiling_is(ProfilingStatus.RUNNING, ProfilingStatus.SOLVING):
            raise Conflict(
                "online profiling is running; it will store the profile itself", field="profile"
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8 text", field="profile") from None
        is_json = "json" in content_type or text.lstrip().startswith(("{", "["))
        # Parsed (JSON with bounded depth and integer length) and checked against the job's
        # schedule off the loop: on a thread, or in a worker process for large documents.
        result = await self.pool.parse(
            text, is_json, job.schedule.to_json(), job.spec.blocking_power
        )
        if result[0] == "error":
            _, detail, field, row = result
            extra = {"row": row} if row is not None else {}
            raise BadRequest(
                detail, field=f"profile.{field}" if field else "profile", **extra
            ) from None
        _, profile, csv_text = result
        job = self.ctx.jobs.get(job_id)  # (still there: deleted meanwhile is a 404)
        check_clocks(job, profile, list(job.ranks.by_global.values()))
        return self.store(job, profile, "upload", csv_text)

    def store(
        self, job: Job, profile: Profile, source: str, csv_text: str | None = None
    ) -> dict[str, Any]:
        """Store ``profile`` as the job's new revision; returns its summary.

        Its canonical CSV is used when already made.
        """
        csv_text = profile.to_csv() if csv_text is None else csv_text
        rev = self.ctx.store.put_profile(job.id, csv_text, source)
        job.profile.set(profile, rev, source)
        return self.summary(job.id)

    def summary(self, job_id: str) -> dict[str, Any]:
        """The summary of the job's current profile; 404 when it has none."""
        job = self.ctx.jobs.get(job_id)
        profile = job.profile.current
        if profile is None:
            raise NotFound(_NO_PROFILE, field="profile")
        return {
            "revision": job.profile.revision,
            "source": job.profile.source,
            "stages": profile.stages,
            "instructions": list(profile.kinds),
            "frequencies": profile.frequencies,
            "rows": sum(len(p.frequencies) for p in profile.entries.values()),
        }

    def get(self, job_id: str) -> Profile:
        """The job's current profile; 404 when it has none."""
        profile = self.ctx.jobs.get(job_id).profile.current
        if profile is None:
            raise NotFound(_NO_PROFILE, field="profile")
        return profile
