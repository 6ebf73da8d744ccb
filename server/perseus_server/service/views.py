"""Read-only views of the state, as the REST API returns them.

A job, its status (ranks, pipelines, plan, frontier, stragglers, profiling) and the server's health.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

from perseus_server.domain.errors import BadRequest
from perseus_server.service.clock_verification import CAUSE, rank_view
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.measured_power import MeasuredPower
from perseus_server.service.slow_links import link_views
from perseus_server.service.solves import Solves
from perseus_server.service.state import Job

__all__ = ["Views"]

_CURSOR_SEP = "."


def _micros(created: float) -> int:
    return round(created * 1e6)


def _cursor(micros: int, job_id: str) -> str:
    """The opaque ``next`` cursor after job ``job_id`` created at ``micros``.

    The cursor is hexadecimal microseconds since the epoch, a dot, the id: it keeps its place
    when the job is deleted.
    """
    return f"{micros:x}{_CURSOR_SEP}{job_id}"


#: Ranks listed in a status document unless the request asks for another page size.
STATUS_RANKS = 64
#: At most this many ranks are listed in one status document (a page).
MAX_STATUS_RANKS = 1024


def _off_plan_by_pipeline(job: Job) -> dict[int, list[int]]:
    """Per pipeline, the global ranks that ran off-plan within their window, lowest first.

    What :func:`off_plan_ranks` gives one pipeline at a time, in one pass over the ranks that
    verify their clocks rather than one pass over every rank per pipeline.
    """
    out: dict[int, list[int]] = {}
    for rank_id, record in job.stragglers.detector.clocks.items():
        r = job.ranks.by_id.get(rank_id)
        if r is not None and record.off_plan and job.ranks.by_global.get(r.global_rank) is r:
            out.setdefault(r.data_rank, []).append(r.global_rank)
    for ranks in out.values():
        ranks.sort()
    return out


class Views:
    """Job, status and health documents."""

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: Deployer,
        solves: Solves,
        measured: MeasuredPower,
        started: float,
        power_share: Callable[[Job], dict[str, Any] | None],
        lifecycle: Callable[[str], dict[str, Any]],
        profile_mismatch: Callable[[Job], dict[str, Any] | None],
        power_draw: Callable[[Job], dict[str, Any]] | None = None,
    ) -> None:
        """Set up the views.

        ``power_share``: a job's share of the cluster power budget for its status (None: the
        budget does not cover it); ``lifecycle``: a job's lifecycle view (state, since,
        reason); ``profile_mismatch``: whether the job's profile describes it (None: no
        mismatch); ``power_draw``: what the job draws on a power budget, and why (the
        pipelines counted).
        """
        self.ctx = ctx
        self.deployer = deployer
        self.solves = solves
        self.started = started
        #: Uptime is measured on the monotonic clock (a step of the system clock changes
        #: ``started``'s meaning, not the server's age).
        self._started_monotonic = time.monotonic()
        self.power_share = power_share
        self.lifecycle = lifecycle
        self.profile_mismatch = profile_mismatch
        self.power_draw = power_draw
        self.measured = measured

    def job(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/{id}``: the job's description, tenant, state, profile, plan and lifecycle."""
        job = self.ctx.jobs.get(job_id)
        return {
            "id": job.id,
            "created": job.row.created,
            "tenant": job.row.tenant,
            "state": job.state(),
            **job.spec.to_json(),
            "instructions": job.schedule.num_instructions,
            "world_size": job.spec.world_size,
            "profile": None
            if job.profile.current is None
            else {"revision": job.profile.revision, "source": job.profile.source},
            "frontier_status": job.frontier.row.status,
            "plan_version": job.deployment.version if job.deployment.current is not None else 0,
            "lifecycle": self.lifecycle(job.id),
        }

    def jobs(
        self, limit: int, after: str | None = None, tenant: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of at most ``limit`` job summaries after the cursor ``after`` (creation order).

        And the cursor of the next page (None: the last page). Custom orders are left out:
        the page's size follows ``limit``, not the jobs' schedules.

        A cursor names the creation time and id of the last job listed (:func:`_cursor`), so a
        listing goes on when that job is deleted meanwhile; a plain job id (an older cursor)
        is accepted while its job exists. ``tenant``: that tenant's jobs only.
        """
        order = sorted(
            (_micros(j.row.created), j.id)
            for j in self.ctx.jobs
            if tenant is None or j.row.tenant == tenant
        )
        start = 0
        if after is not None:
            start = bisect.bisect_right(order, self._position(after, tenant))
        page = [job_id for _, job_id in order[start : start + limit]]
        more = start + limit < len(order)
        last = order[start + len(page) - 1] if page else None
        return [self.summary(j) for j in page], (_cursor(*last) if more and last else None)

    def _position(self, after: str, tenant: str | None = None) -> tuple[int, str]:
        """Where a cursor (or a job's id) stands.

        Another tenant's job id is no cursor of a tenant's listing (its existence does not
        leak).
        """
        if after in self.ctx.jobs and (
            tenant is None or self.ctx.jobs.get(after).row.tenant == tenant
        ):
            return (_micros(self.ctx.jobs.get(after).row.created), after)
        micros, sep, job_id = after.partition(_CURSOR_SEP)
        try:
            if not sep or not job_id or len(micros) > 16:
                raise ValueError(after)
            return (int(micros, 16), job_id)
        except ValueError:
            raise BadRequest(
                f"not a cursor of this listing, nor a job's id: {after[:64]!r}", field="after"
            ) from None

    def summary(self, job_id: str) -> dict[str, Any]:
        """:meth:`job` without a custom schedule's orders."""
        doc = self.job(job_id)
        if doc["schedule"].get("orders") is not None:
            doc["schedule"] = {"name": doc["schedule"]["name"]}
        return doc

    def _ranks(
        self, job: Job, connected: set[str], limit: int, after: int | None
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A page of at most ``limit`` ranks after global rank ``after``, by global rank.

        And the ``after`` of the next page (None: the last). Costs the page, not the job.
        """
        keys = sorted(job.ranks.by_global)
        start = 0 if after is None else bisect.bisect_right(keys, after)
        chosen = keys[start : start + limit]
        more = start + limit < len(keys)
        ranks = []
        for g in chosen:
            r = job.ranks.by_global[g]
            hist = job.ranks.history.get(r.rank_id)
            last = hist[-1] if hist else None
            ranks.append(
                {
                    **r.to_json(),
                    "connected": r.rank_id in connected,
                    "last_iteration": last[0] if last else None,
                    "last_iteration_time": last[1] if last else None,
                    "last_plan_version": last[3] if last else None,
                }
            )
            control = job.ranks.clock_control.get(r.rank_id)
            if control is not None:  # additive: only for ranks that say
                ranks[-1]["clock_control"] = control[0]
                ranks[-1]["clock_control_reason"] = control[1] or None
            floor = job.ranks.power_floor.get(r.rank_id)
            if floor is not None:  # additive: only for ranks whose plan has floors
                ranks[-1]["power_floor"] = floor[0]
                ranks[-1]["power_floor_reason"] = floor[1] or None
                ranks[-1]["plan_swing"] = floor[2]
            clocks = rank_view(job, r.rank_id)
            if clocks is not None:  # additive: only for ranks that verify their clocks
                ranks[-1]["applied_clocks"] = clocks
        return ranks, (chosen[-1] if more and chosen else None)

    def _pipelines(self, job: Job) -> list[dict[str, Any]]:
        off_plan = _off_plan_by_pipeline(job)
        pipelines = []
        for p in range(job.spec.data_parallel):
            times = job.ranks.pipeline_times.get(p)
            recent = list(islice(reversed(times.items()), 16))[::-1] if times else []
            s = job.stragglers.stragglers.get(p)
            ss = job.stragglers.slow_stages.get(p)
            off = off_plan.get(p, [])
            straggler = None if s is None else {"time": s.time, "source": s.source}
            doc: dict[str, Any] = {
                "pipeline": p,
                "recent_iterations": [{"iteration": i, "time": t} for i, t in recent],
                "straggler": straggler,
                "slow_stages": None if ss is None else ss.to_json(),
            }
            doc.update(link_views(job, p))  # measured links and slow links
            if off:  # additive fields, present while a rank of the pipeline runs off-plan
                doc["off_plan_ranks"] = off
                if straggler is not None:
                    straggler["cause"] = CAUSE
            pipelines.append(doc)
        return pipelines

    def status(
        self, job_id: str, ranks: int = STATUS_RANKS, after: int | None = None
    ) -> dict[str, Any]:
        """The job's live state, with the detail of at most ``ranks`` ranks after ``after``.

        ``after`` is a global rank.

        ``ranks_next`` is the ``after`` of the next page, or None. Its cost is bounded by
        the page, not by the job's world size.
        """
        job = self.ctx.jobs.get(job_id)
        connected = self.ctx.hub.connected(job_id)
        slow = job.stragglers
        page, ranks_next = self._ranks(job, connected, min(ranks, MAX_STATUS_RANKS), after)
        return {
            "job_id": job.id,
            "state": job.state(),
            "lifecycle": self.lifecycle(job.id),
            "expected_ranks": job.spec.world_size,
            "registered_ranks": len(job.ranks.by_global),
            "connected_ranks": len(connected),
            "plan": self.deployer.view(job),
            "frontier": {
                k: v
                for k, v in self.solves.status(job_id, points=False).items()
                if k != "worker_pid"
            },
            "pipelines": self._pipelines(job),
            "ranks": page,
            "ranks_next": ranks_next,
            "straggler_detection": slow.detector.settings.to_json(),
            "iteration_overhead": slow.detector.calibration(),
            "recent_replans": list(slow.replans),
            "profiling": job.profiling.progress() if job.profiling is not None else None,
            "power_budget": self.power_share(job),
            "power_draw": self.power_draw(job) if self.power_draw is not None else None,
            "measured": self.measured.view(job),
            "profile_mismatch": self.profile_mismatch(job),
        }

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: status, number of jobs, uptime and the kernels' state."""
        return {
            "status": "ok",
            "jobs": len(self.ctx.jobs),
            "uptime_seconds": time.monotonic() - self._started_monotonic,
            "kernels": self.ctx.solver.kernels,
        }
