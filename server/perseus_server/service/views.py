"""Read-only views of the state: a job, its status (ranks, pipelines, plan, frontier,
stragglers, profiling) and the server's health, as the REST API returns them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from perseus_server.domain.errors import BadRequest
from perseus_server.service.clock_verification import CAUSE, off_plan_ranks, rank_view
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.measured_power import MeasuredPower
from perseus_server.service.solves import Solves
from perseus_server.service.state import Job

__all__ = ["Views"]

#: At most this many ranks are listed in a status document.
MAX_STATUS_RANKS = 4096


class Views:
    """Job, status and health documents."""

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: Deployer,
        solves: Solves,
        measured: MeasuredPower,
        started: float,
    ) -> None:
        self.ctx = ctx
        self.deployer = deployer
        self.solves = solves
        self.started = started
        #: The job's share of the cluster power budget (set by the service).
        self.power_share: Callable[[Job], dict[str, Any] | None] = lambda job: None
        self.measured = measured

    def job(self, job_id: str) -> dict[str, Any]:
        job = self.ctx.jobs.get(job_id)
        return {
            "id": job.id,
            "created": job.row.created,
            "state": job.state(),
            **job.spec.to_json(),
            "instructions": job.schedule.num_instructions,
            "world_size": job.spec.world_size,
            "profile": None
            if job.profile.current is None
            else {"revision": job.profile.revision, "source": job.profile.source},
            "frontier_status": job.frontier.row.status,
            "plan_version": job.deployment.version if job.deployment.current is not None else 0,
        }

    def jobs(self, limit: int, after: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """A page of at most ``limit`` job summaries after job ``after`` (creation order), and
        the cursor of the next page (None: the last page). Custom orders are left out: the
        page's size follows ``limit``, not the jobs' schedules."""
        ids = self.ctx.jobs.ids()
        start = 0
        if after is not None:
            if after not in self.ctx.jobs:
                raise BadRequest(f"no job with id {after[:64]!r}", field="after")
            start = ids.index(after) + 1
        page = ids[start : start + limit]
        more = start + limit < len(ids)
        return [self.summary(j) for j in page], (page[-1] if more and page else None)

    def summary(self, job_id: str) -> dict[str, Any]:
        """:meth:`job` without a custom schedule's orders."""
        doc = self.job(job_id)
        if doc["schedule"].get("orders") is not None:
            doc["schedule"] = {"name": doc["schedule"]["name"]}
        return doc

    def _ranks(self, job: Job, connected: set[str]) -> list[dict[str, Any]]:
        ranks = []
        for r in sorted(job.ranks.by_global.values(), key=lambda r: r.global_rank):
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
            clocks = rank_view(job, r.rank_id)
            if clocks is not None:  # additive: only for ranks that verify their clocks
                ranks[-1]["applied_clocks"] = clocks
        return ranks[:MAX_STATUS_RANKS]

    def _pipelines(self, job: Job) -> list[dict[str, Any]]:
        pipelines = []
        for p in range(job.spec.data_parallel):
            times = job.ranks.pipeline_times.get(p)
            recent = list(times.items())[-16:] if times else []
            s = job.stragglers.stragglers.get(p)
            ss = job.stragglers.slow_stages.get(p)
            off = [r.global_rank for r in off_plan_ranks(job, p)]
            straggler = None if s is None else {"time": s.time, "source": s.source}
            doc: dict[str, Any] = {
                "pipeline": p,
                "recent_iterations": [{"iteration": i, "time": t} for i, t in recent],
                "straggler": straggler,
                "slow_stages": None if ss is None else ss.to_json(),
            }
            if off:  # additive fields, present while a rank of the pipeline runs off-plan
                doc["off_plan_ranks"] = off
                if straggler is not None:
                    straggler["cause"] = CAUSE
            pipelines.append(doc)
        return pipelines

    def status(self, job_id: str) -> dict[str, Any]:
        job = self.ctx.jobs.get(job_id)
        connected = self.ctx.hub.connected(job_id)
        slow = job.stragglers
        return {
            "job_id": job.id,
            "state": job.state(),
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
            "ranks": self._ranks(job, connected),
            "straggler_detection": slow.detector.settings.to_json(),
            "iteration_overhead": slow.detector.calibration(),
            "recent_replans": list(slow.replans),
            "profiling": job.profiling.progress() if job.profiling is not None else None,
            "power_budget": self.power_share(job),
            "measured": self.measured.view(job),
        }

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "jobs": len(self.ctx.jobs),
            "uptime_seconds": time.time() - self.started,
            "kernels": self.ctx.solver.kernels,
        }
