"""Online profiling of a job: a frequency scan deployed one clock step at a time.

The frequency scan of :class:`~perseus_server.decisions.profiling_scan.ProfilingSession` deployed
one clock step at a time, its measured profile stored and solved at the end (max clocks meanwhile),
or the previous plan restored when it fails or is aborted.
"""

from __future__ import annotations

import time
from typing import Any

from perseus.errors import ProfileError
from perseus.problem import EnergyProblem
from perseus.profiles import parse_profile_csv
from perseus_server.decisions.link_fit import fit_transfers, with_measured_transfers
from perseus_server.decisions.profiling_scan import (
    DEFAULT_MAX_REVISITS,
    DEFAULT_TOLERANCE,
    ProfilingSession,
)
from perseus_server.domain.errors import BadRequest, Conflict, NotFound
from perseus_server.domain.states import DeploymentKind, ProfilingStatus
from perseus_server.runtime.faults import fault_point
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.job_profiles import Profiles
from perseus_server.service.report_checks import CheckedReport, measurements
from perseus_server.service.slow_links import combined_link_times
from perseus_server.service.solves import Solves
from perseus_server.service.state import Deployment, Job

__all__ = ["OnlineProfiling"]


def _frequencies(job: Job, given: list[int] | None) -> list[int]:
    """The clocks to scan, fastest first.

    ``given`` (checked against the ranks' supported clocks) or every clock all registered ranks
    support.
    """
    ranks = list(job.ranks.by_global.values())
    if given is None:
        if not ranks or any(not r.supported_clocks for r in ranks):
            raise Conflict(
                "no registered rank reported its supported clocks; give frequencies",
                field="frequencies",
            )
        common = set(ranks[0].supported_clocks)
        for r in ranks[1:]:
            common &= set(r.supported_clocks)
        if not common:
            raise Conflict(
                "the registered ranks share no supported clock; give frequencies",
                field="frequencies",
            )
        return sorted(common, reverse=True)
    if not given or len(given) > 255 or len(set(given)) != len(given):
        raise BadRequest("must be 1..255 distinct frequencies", field="frequencies")
    if any(f <= 0 for f in given):
        raise BadRequest("frequencies must be positive MHz values", field="frequencies")
    for r in ranks:
        bad = sorted(set(given) - set(r.supported_clocks)) if r.supported_clocks else []
        if bad:
            raise BadRequest(
                f"rank {r.global_rank} does not support {bad[:5]} MHz", field="frequencies"
            )
    return sorted(given, reverse=True)


class OnlineProfiling:
    """``/jobs/{id}/profiling``: start, follow and abort frequency scans."""

    def __init__(
        self, ctx: ServiceContext, deployer: Deployer, profiles: Profiles, solves: Solves
    ) -> None:
        self.ctx = ctx
        self.deployer = deployer
        self.profiles = profiles
        self.solves = solves

    def observe(self, checked: CheckedReport) -> None:
        """One accepted report while the job is profiled.

        Its measurements (none in the client's warm-up iterations, which count too: the
        warm-up is counted once, here), its links' times; then the next clock step, or the
        measured profile, when it completes one.
        """
        job, rank, rep = checked.job, checked.rank, checked.report
        if not job.profiling_is(ProfilingStatus.RUNNING):
            return
        assert job.profiling is not None
        ms = checked.measurements if checked.measurements is not None else measurements(rep)
        job.profiling.record(
            rank.rank_id,
            int(rep.plan_version),
            float(rep.energy),
            ms,
            iteration_time=float(rep.iteration_time),
            transfers=dict(combined_link_times(job, rank, rep)) if rep.transfers else None,
        )
        if ms:
            self.tick(job)

    def forget(self, job_id: str) -> None:
        """Nothing to do: a scan is kept on the job."""

    def start(
        self,
        job_id: str,
        frequencies: list[int] | None,
        warmup: int,
        iterations: int,
        stop_after_rises: int,
        tolerance: float = DEFAULT_TOLERANCE,
    ) -> dict[str, Any]:
        """Start a scan (see :class:`ProfilingSession` for what each setting does)."""
        job = self.ctx.jobs.get(job_id)
        if self.ctx.solver.is_active(job_id):
            raise Conflict("a frontier computation is running; cancel it first", field="profiling")
        if job.profiling_is(ProfilingStatus.RUNNING, ProfilingStatus.SOLVING):
            raise Conflict("online profiling is already running for this job", field="profiling")
        freqs = _frequencies(job, frequencies)
        for name, v, lo in (
            ("warmup_iterations", warmup, 0),
            ("iterations_per_frequency", iterations, 1),
            ("stop_after_rises", stop_after_rises, 1),
        ):
            if not (lo <= v <= 1000):
                raise BadRequest(f"must be between {lo} and 1000, got {v}", field=name)
        if not (0.0 <= tolerance <= 0.5):
            raise BadRequest(f"must be between 0 and 0.5, got {tolerance!r}", field="tolerance")
        job.profiling = ProfilingSession(
            freqs,
            warmup,
            iterations,
            stop_after_rises,
            blocking_power=job.spec.blocking_power,
            tolerance=tolerance,
            max_revisits=DEFAULT_MAX_REVISITS,
        )
        self._step(job)
        return self.status(job_id)

    def _step(self, job: Job) -> None:
        s = job.profiling
        assert s is not None
        version = job.deployment.version + 1
        s.step_version = version
        self.ctx.store.put_profiling(job.id, s.to_json())
        self.deployer.publish(
            job,
            Deployment(
                version=version,
                kind=DeploymentKind.PROFILING,
                reason=f"online profiling: {s.frequency} MHz "
                + (
                    f"again (the fastest clocks' times, {len(s.revisited) + 1} of at most "
                    f"{s.max_revisits})"
                    if s.revisit is not None
                    else f"({s.step + 1} of at most {len(s.frequencies)})"
                ),
                profiling={
                    "frequency": s.frequency,
                    "warmup_iterations": s.warmup_iterations,
                    "iterations": s.iterations,
                },
                deployed_at=time.time(),
            ),
            "profiling",
        )

    def tick(self, job: Job) -> None:
        """After measured reports: next clock step, or store and solve the measured profile."""
        s = job.profiling
        if s is None or not s.step_complete(set(job.ranks.by_id), job.schedule.stages):
            return
        if not s.advance():
            self._step(job)
            return
        try:
            profile = parse_profile_csv(s.profile_csv())
            if s.transfers:  # the measured transfer times: the profile's communication part
                profile = with_measured_transfers(
                    profile, fit_transfers(s.transfers), job.profile.current
                )
            EnergyProblem.build(profile, job.schedule, job.spec.blocking_power)
        except ProfileError as e:
            s.status, s.error = ProfilingStatus.FAILED, f"the measured profile is unusable: {e}"
            self.ctx.store.put_profiling(job.id, s.to_json())
            self._leave(job)
            return
        # Profile, profiling state, the max-clock deployment and the queued solve: one
        # transaction (a crash leaves the scan's last step or all of the finish).
        with self.ctx.store.transaction():
            self.profiles.store(job, profile, "online profiling")
            fault_point("after_profile_store")
            s.status = ProfilingStatus.SOLVING
            self.ctx.store.put_profiling(job.id, s.to_json())
            self._leave(job)
            self.solves.launch(job)
        fault_point("after_profiling_commit")

    def _leave(self, job: Job) -> None:
        """Leave the profiling plan: the previous frontier's plan, or max clocks meanwhile."""
        s = job.profiling
        solving = s is not None and s.status is ProfilingStatus.SOLVING
        if job.frontier.current is not None and not solving:
            self.deployer.decide(job, "profiling ended", force=True)
            return
        self.deployer.publish(
            job,
            Deployment(
                version=job.deployment.version + 1,
                kind=DeploymentKind.MAX_CLOCK,
                reason="online profiling finished; computing the frontier (max clocks meanwhile)"
                if solving
                else "profiling ended: max clocks",
                max_clock=s.frequencies[0] if s is not None else 0,
                deployed_at=time.time(),
            ),
            "profiling",
        )

    def abort(self, job_id: str) -> dict[str, Any]:
        """Abort the job's online profiling; 409 when none is running."""
        job = self.ctx.jobs.get(job_id)
        if job.profiling is None or job.profiling.status is not ProfilingStatus.RUNNING:
            raise Conflict("no online profiling is running for this job", field="profiling")
        job.profiling.status, job.profiling.error = ProfilingStatus.ABORTED, "aborted by request"
        self.ctx.store.put_profiling(job.id, job.profiling.to_json())
        self._leave(job)
        return self.status(job_id)

    def status(self, job_id: str) -> dict[str, Any]:
        """The job's online-profiling progress; 404 when it was never started."""
        job = self.ctx.jobs.get(job_id)
        if job.profiling is None:
            raise NotFound("online profiling was never started for this job", field="profiling")
        out = job.profiling.progress()
        out["ranks"] = len(job.ranks.by_id)
        return out
