"""Straggling pipelines: reported through the REST API, detected from reported iteration times
(see :class:`~perseus_server.policy.detectors.StragglerDetector`), cleared; each change re-decides the
plans (the others move to the frontier point that matches the straggler's time)."""

from __future__ import annotations

import math

from perseus_server.domain.bounds import MAX_SECONDS
from perseus_server.domain.errors import BadRequest, Conflict, NotFound
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import DetectorEvent, ReplanKind, StragglerSource
from perseus_server.policy.detectors import DetectorSettings, StageDetector, StragglerDetector
from perseus_server.policy.planner import Straggler, resolve_policy
from perseus_server.service.clock_verification import CAUSE, detector_feeder, off_plan_ranks
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer, require_frontier
from perseus_server.service.persistence import persist_deployment
from perseus_server.service.slow_stages import SlowStageResolver
from perseus_server.service.state import Job

__all__ = ["Stragglers"]


class Stragglers:
    """Reported, detected and cleared stragglers."""

    def __init__(
        self, ctx: ServiceContext, deployer: Deployer, slow_stages: SlowStageResolver
    ) -> None:
        self.ctx = ctx
        self.deployer = deployer
        self.slow_stages = slow_stages

    def report(
        self, job_id: str, pipeline: int, slowdown: float | None, iteration_time: float | None
    ) -> None:
        """``POST /jobs/{id}/stragglers``: pipeline ``pipeline`` runs slow."""
        job = self.ctx.jobs.get(job_id)
        frontier = require_frontier(job)
        if not (0 <= pipeline < job.spec.data_parallel):
            raise BadRequest(
                f"must be between 0 and {job.spec.data_parallel - 1} (the job's data_parallel "
                f"is {job.spec.data_parallel}), got {pipeline}",
                field="pipeline",
            )
        if job.spec.data_parallel == 1:
            raise Conflict(
                "the job has one pipeline (data_parallel 1): a slow pipeline makes no other one "
                "wait, so there is nothing to replan",
                field="pipeline",
            )
        if (slowdown is None) == (iteration_time is None):
            raise BadRequest("give exactly one of slowdown and iteration_time", field="slowdown")
        if slowdown is not None:
            if not (math.isfinite(slowdown) and 0 < slowdown <= 100):
                raise BadRequest(
                    f"must be a number in (0, 100], got {slowdown!r}", field="slowdown"
                )
            base = float(frontier.times[resolve_policy(frontier, job.deployment.policy)])
            t = base * (1 + slowdown)
        else:
            assert iteration_time is not None
            if not (math.isfinite(iteration_time) and 0 < iteration_time <= MAX_SECONDS):
                raise BadRequest(
                    f"must be a positive number of seconds, got {iteration_time!r}",
                    field="iteration_time",
                )
            planned = float(frontier.times[resolve_policy(frontier, job.deployment.policy)])
            if iteration_time < planned:
                raise BadRequest(
                    f"{iteration_time!r} s is faster than the plan's own iteration time "
                    f"({planned:.6g} s): a straggler is slower than its plan",
                    field="iteration_time",
                )
            t = iteration_time
        slow = job.stragglers
        slow.stragglers = {
            **slow.stragglers,
            pipeline: Straggler(pipeline, t, StragglerSource.REPORTED),
        }
        self.deployer.replan(
            job, f"pipeline {pipeline} reported slow ({t:.4g} s per iteration)", ReplanKind.REPORTED
        )

    def clear(self, job_id: str, pipeline: int | None) -> None:
        """``DELETE /jobs/{id}/stragglers``: forget one pipeline's (or every) straggler."""
        job = self.ctx.jobs.get(job_id)
        require_frontier(job)
        slow = job.stragglers
        if (
            pipeline is not None
            and pipeline not in slow.stragglers
            and pipeline not in slow.slow_stages
        ):
            raise NotFound(f"pipeline {pipeline} is not marked as a straggler", field="pipeline")
        slow.stragglers = (
            {} if pipeline is None else {p: s for p, s in slow.stragglers.items() if p != pipeline}
        )
        slow.detector.reset(pipeline)
        slow.stage_detector.reset(pipeline)
        for p in list(slow.slow_stages) if pipeline is None else [pipeline]:
            self.slow_stages.drop(job, p)
        self.deployer.replan(
            job,
            "straggler(s) cleared" if pipeline is None else f"pipeline {pipeline} cleared",
            ReplanKind.CLEARED,
        )

    def set_detector(self, job_id: str, settings: DetectorSettings) -> None:
        job = self.ctx.jobs.get(job_id)
        clocks = job.stragglers.detector.clocks  # the ranks' applied-clock records stay
        job.stragglers.detector = StragglerDetector(settings, clocks)
        job.stragglers.stage_detector = StageDetector(settings)
        if job.deployment.current is not None or job.frontier.current is not None:
            persist_deployment(self.ctx.store, job)

    def observe(self, job: Job, rank: RankInfo, seconds: float, version: int) -> None:
        """One reported iteration: the pipeline's leader rank feeds the iteration detector."""
        dep = job.deployment.plan
        if dep is None or version != dep.version or job.frontier.current is None:
            return
        p = rank.data_rank
        # The leader feeds the detector, or the pipeline's off-plan rank while there is one
        # (its measured times are what they are; see perseus_server.policy.detectors).
        if rank.global_rank != detector_feeder(job, p):
            return
        slow = job.stragglers
        expected = float(self.deployer.pipeline_frontier(job, dep, p).times[dep.indices[p]])
        current = slow.stragglers.get(p)
        detected = current is not None and current.source is StragglerSource.DETECTED
        flagged = current is not None or p in slow.slow_stages
        known = current.time * slow.detector.calibration() if detected and current else None
        event, t_prime = slow.detector.observe(p, seconds, expected, flagged, known)
        if event in (DetectorEvent.SLOW, DetectorEvent.CHANGED):
            c = slow.detector.calibration()
            on_axis = f"T'={t_prime / c:.4g} s on the profile's axis"
            if event is DetectorEvent.SLOW:
                why = (
                    f"pipeline {p} detected slow: {t_prime:.4g} s per iteration vs "
                    f"{expected:.4g} s planned (x{c:.3f} common overhead: {on_axis})"
                )
            else:  # a detected straggler's pace moved: known is its old T'
                why = (
                    f"pipeline {p} pace changed: {t_prime:.4g} s per iteration, was "
                    f"{known:.4g} s ({on_axis})"
                )
            off = off_plan_ranks(job, p)
            if off:
                why += f"; {CAUSE} on rank(s) {', '.join(str(r.global_rank) for r in off)}"
            slow.stragglers = {
                **slow.stragglers,
                p: Straggler(p, t_prime / c, StragglerSource.DETECTED),
            }
            kind = ReplanKind.DETECTED if event is DetectorEvent.SLOW else ReplanKind.PACE_CHANGED
            self.deployer.replan(job, why, kind)
        elif event is DetectorEvent.RECOVERED and detected:
            slow.stragglers = {q: s for q, s in slow.stragglers.items() if q != p}
            self.deployer.replan(job, f"pipeline {p} recovered", ReplanKind.RECOVERED)
