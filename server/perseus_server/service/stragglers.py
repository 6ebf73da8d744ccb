"""Straggling pipelines: reported, detected, cleared; each change re-decides the plans.

Reported through the REST API, detected from reported iteration times (by the job's
:class:`~perseus_server.decisions.detectors.Detector`, which owns its calibration: this module
passes raw measured times and takes T' back on the profile's axis), cleared; each change re-decides
the plans (the others move to the frontier point that matches the straggler's time).

Two guards keep noise from pushing plan versions (``docs/server.md``, "Replanning"):

* **dwell**: a pipeline replanned less than ``Limits.replan_dwell_seconds`` ago ignores what
  its detector concludes until the dwell has passed (the detector keeps its counts, so a real
  change is acted on right after); the detector's thresholds add the hysteresis;
* **profile mismatch** (:class:`ProfileChecks`): when the measured iteration times are far
  from the plan's prediction, the job's profile does not describe it; the job is marked
  ``profile_mismatch`` and its straggler replanning pauses.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from perseus_server.decisions.detectors import DetectorSettings, make_detectors
from perseus_server.decisions.planner import Straggler, resolve_policy
from perseus_server.decisions.report_statistics import calibration
from perseus_server.domain.bounds import MAX_SECONDS
from perseus_server.domain.errors import BadRequest, Conflict, NotFound
from perseus_server.domain.states import (
    DetectorEvent,
    ProfilingStatus,
    ReplanKind,
    StragglerSource,
)
from perseus_server.service.clock_verification import CAUSE, detector_feeder, off_plan_ranks
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer, require_frontier
from perseus_server.service.persistence import persist_deployment
from perseus_server.service.report_checks import CheckedReport
from perseus_server.service.slow_stages import SlowStageResolver
from perseus_server.service.state import Job

__all__ = ["Mismatch", "ProfileChecks", "Stragglers"]

log = logging.getLogger("perseus.server")


@dataclass
class Mismatch:
    """A job's profile judged against its measured iterations.

    Each pipeline's recent ratios of measured to planned iteration time, and the mismatch when
    there is one.
    """

    profile_revision: int = 0
    ratios: dict[int, deque[float]] = field(default_factory=dict)
    ratio: float | None = None  # the job's figure: the healthiest pipeline's median ratio
    since: float | None = None  # when the mismatch was found (None: none now)
    reason: str | None = None


class ProfileChecks:
    """``profile_mismatch`` (see the module docstring), with hysteresis.

    Over the last ``iterations`` reported iterations of each pipeline, the job's ratio is the
    smallest of the pipelines' median ratios of measured to planned time (a straggler does not
    count; overhead common to every pipeline does). Outside the band ``(low, high)`` the job is
    mismatched; it clears once the ratio is back within the band's geometric middle half
    (``sqrt(low)..sqrt(high)``: hysteresis), or when a new profile is stored.
    """

    def __init__(self, band: tuple[float, float], iterations: int) -> None:
        self.low, self.high = float(band[0]), float(band[1])
        self.iterations = max(1, int(iterations))
        self._jobs: dict[str, Mismatch] = {}

    def get(self, job: Job) -> Mismatch:
        """The job's mismatch record, started afresh when its profile changed."""
        m = self._jobs.get(job.id)
        if m is None or m.profile_revision != job.profile.revision:
            m = self._jobs[job.id] = Mismatch(job.profile.revision)
        return m

    def reason(self, job: Job) -> str | None:
        """Why the job's measured figures are withheld (None: they are not)."""
        m = self._jobs.get(job.id)
        if m is None or m.profile_revision != job.profile.revision:
            return None
        return m.reason

    def forget(self, job_id: str) -> None:
        """Drop the job's record (the job was deleted)."""
        self._jobs.pop(job_id, None)

    def flags(self) -> dict[str, bool]:
        """Per job checked so far, whether it is mismatched now."""
        return {j: m.reason is not None for j, m in self._jobs.items()}

    def observe(self, job: Job, pipeline: int, ratio: float) -> bool:
        """One iteration of ``pipeline`` ran ``ratio`` times its planned time.

        Returns whether the job is mismatched now.
        """
        m = self.get(job)
        recent = m.ratios.setdefault(pipeline, deque(maxlen=self.iterations))
        recent.append(ratio)
        r = calibration(m.ratios.values(), full=self.iterations)
        if r is None:
            return m.reason is not None
        m.ratio = r
        if m.reason is None and not (self.low <= r <= self.high):
            m.since = time.time()
            m.reason = (
                f"measured iterations take {r:.3g}x the plan's predicted time (median of the "
                f"last {self.iterations}; outside [{self.low:g}, {self.high:g}]): the profile does "
                "not describe this job as it runs; energy-saved figures are withheld and "
                "straggler replanning is paused. Measure the job's own profile with online "
                "profiling (POST /jobs/{id}/profiling), or upload one measured on this hardware."
            )
            log.warning("job %s: profile mismatch: %s", job.id, m.reason)
        elif m.reason is not None and math.sqrt(self.low) <= r <= math.sqrt(self.high):
            log.info("job %s: profile mismatch cleared (ratio %.3g)", job.id, r)
            m.reason, m.since = None, None
        return m.reason is not None

    def view(self, job: Job) -> dict[str, Any] | None:
        """``profile_mismatch`` of the job's status.

        None: the profile matches, or too few iterations were reported to tell.
        """
        m = self._jobs.get(job.id)
        if m is None or m.reason is None or m.profile_revision != job.profile.revision:
            return None
        return {
            "ratio": m.ratio,
            "band": [self.low, self.high],
            "iterations": self.iterations,
            "since": m.since,
            "reason": m.reason,
        }


class Stragglers:
    """Reported, detected and cleared stragglers."""

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: Deployer,
        slow_stages: SlowStageResolver,
        checks: ProfileChecks,
    ) -> None:
        """``checks``: the job's profile checks (shared with measured power and the views)."""
        self.ctx = ctx
        self.deployer = deployer
        self.slow_stages = slow_stages
        self.checks = checks
        self.dwell = float(ctx.limits.replan_dwell_seconds)
        #: Per (job, pipeline), when it was last replanned (the dwell counts from there).
        self._replanned: dict[tuple[str, int], float] = {}

    # --- dwell -----------------------------------------------------------------------------------

    def _mark_replanned(self, job: Job, pipeline: int | None) -> None:
        now = time.monotonic()
        for p in range(job.spec.data_parallel) if pipeline is None else (pipeline,):
            self._replanned[(job.id, p)] = now

    def mark_replanned(self, job: Job, pipeline: int) -> None:
        """``pipeline`` was just replanned for another cause (a slow link): the dwell counts."""
        self._mark_replanned(job, pipeline)

    def dwelling(self, job: Job, pipeline: int) -> bool:
        """Whether ``pipeline`` was replanned less than the dwell time ago."""
        last = self._replanned.get((job.id, pipeline))
        return last is not None and time.monotonic() - last < self.dwell

    def forget(self, job_id: str) -> None:
        """The job was deleted."""
        self.checks.forget(job_id)
        for key in [k for k in self._replanned if k[0] == job_id]:
            del self._replanned[key]

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
        self._mark_replanned(job, pipeline)

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
        self._mark_replanned(job, pipeline)

    def set_detector(self, job_id: str, settings: DetectorSettings) -> None:
        """Set the job's detector settings: new detectors, the ranks' applied-clock records kept."""
        job = self.ctx.jobs.get(job_id)
        slow = job.stragglers  # the ranks' applied-clock records stay
        slow.detector, slow.stage_detector = make_detectors(settings, slow.detector.clocks)
        if job.deployment.current is not None or job.frontier.current is not None:
            persist_deployment(self.ctx.store, job)

    def observe(self, checked: CheckedReport) -> None:
        """One accepted report (not while the job is profiled).

        The pipeline's leader rank feeds the iteration detector.
        """
        job, rank = checked.job, checked.rank
        if job.profiling_is(ProfilingStatus.RUNNING):
            return
        seconds, version = float(checked.report.iteration_time), int(checked.report.plan_version)
        dep = job.deployment.plan
        if dep is None or version != dep.version or job.frontier.current is None:
            return
        p = rank.data_rank
        # The leader feeds the detector, or the pipeline's off-plan rank while there is one
        # (its measured times are what they are; see perseus_server.decisions.detectors).
        if rank.global_rank != detector_feeder(job, p):
            return
        slow = job.stragglers
        expected = float(self.deployer.pipeline_frontier(job, dep, p).times[dep.indices[p]])
        current = slow.stragglers.get(p)
        detected = current is not None and current.source is StragglerSource.DETECTED
        flagged = current is not None or p in slow.slow_stages
        known = current.time if detected and current else None  # on the profile's axis
        if expected > 0 and self.checks.observe(job, p, seconds / expected):
            return  # the profile does not describe the job: no straggler replanning
        decision = slow.detector.observe(p, seconds, expected, flagged, known)
        if decision.event is not None and self.dwelling(job, p):
            return  # replanned moments ago: the detector still holds its count, act later
        if decision.event in (DetectorEvent.SLOW, DetectorEvent.CHANGED):
            why = slow.detector.explain(p, expected)
            off = off_plan_ranks(job, p)
            if off:
                why += f"; {CAUSE} on rank(s) {', '.join(str(r.global_rank) for r in off)}"
            slow.stragglers = {
                **slow.stragglers,
                p: Straggler(p, decision.time, StragglerSource.DETECTED),
            }
            slow_now = decision.event is DetectorEvent.SLOW
            kind = ReplanKind.DETECTED if slow_now else ReplanKind.PACE_CHANGED
            self.deployer.replan(job, why, kind)
            self._mark_replanned(job, p)
        elif decision.event is DetectorEvent.RECOVERED and detected:
            slow.stragglers = {q: s for q, s in slow.stragglers.items() if q != p}
            self.deployer.replan(job, f"pipeline {p} recovered", ReplanKind.RECOVERED)
            self._mark_replanned(job, p)
