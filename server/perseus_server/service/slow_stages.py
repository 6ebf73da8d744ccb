"""Slow stages: a stage of one pipeline that runs slower than its profile.

It is found from reported per-instruction times (see
:class:`~perseus_server.decisions.detectors.StageDetector`). That pipeline's frontier is re-solved
with the stage's profile scaled; once ready, the pipeline runs its fastest plan and counts as a
straggler of source ``slow stage`` (the others slow down to its time; when another straggler is
slower, it follows that one on its own frontier: :func:`~perseus_server.decisions.planner.decide`).
When its stages are back to their profiled speed, the re-solved frontier and that straggler are
dropped; a straggler of another source stays.

Slow links (:mod:`perseus_server.service.slow_links`) take the same way: the re-solve puts each
slow link's measured transfer time into the profile's communication part.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from perseus.frontier import Frontier
from perseus.profiles import Profile
from perseus_server.decisions.planner import Straggler
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import (
    DetectorEvent,
    ProfilingStatus,
    ReplanKind,
    SlowStageStatus,
    StragglerSource,
)
from perseus_server.runtime.solve_manager import SolveEvents
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.report_checks import CheckedReport, checked_stage_factors
from perseus_server.service.solves import decode_frontier
from perseus_server.service.state import Job, SlowStages

__all__ = [
    "SlowStageResolver",
    "drop_slow_stage_straggler",
    "stage_solve_key",
    "with_transfer_times",
]

log = logging.getLogger("perseus.server")


def stage_solve_key(job: Job, p: int) -> str:
    """The solve manager's key of pipeline ``p``'s re-solve."""
    return f"{job.id}:pipeline{p}"


def drop_slow_stage_straggler(stragglers: dict[int, Straggler], p: int) -> dict[int, Straggler]:
    """``stragglers`` without pipeline ``p``'s slow-stage straggler (others are kept)."""
    return {
        q: s for q, s in stragglers.items() if q != p or s.source is not StragglerSource.SLOW_STAGE
    }


def with_transfer_times(profile: Profile, times: dict[tuple[int, str], float]) -> Profile:
    """``profile`` with the given links' transfer times in its communication part.

    The times are in s per microbatch; a measured time replaces the profiled one.
    """
    comm = profile.communication
    for (b, d), t in sorted(times.items()):
        comm = comm.with_transfer(b, d, t)
    return profile.with_communication(comm)


class SlowStageResolver:
    """Detects slow stages and re-solves their pipelines' frontiers."""

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: Deployer,
        withheld: Callable[[Job], str | None] = lambda job: None,
    ) -> None:
        """Set up the slow-stage resolver.

        ``withheld``: why a job's measured figures are withheld (its profile does not
        describe it: its slow-stage replans pause too; None: they are not).
        """
        self.ctx = ctx
        self.deployer = deployer
        self.withheld = withheld

    def observe(self, checked: CheckedReport) -> None:
        """Take the per-stage factors of one accepted report with measurements.

        Not while the job is profiled, nor while its profile does not describe it.
        """
        job, rank, rep = checked.job, checked.rank, checked.report
        if not rep.instructions or job.profiling_is(ProfilingStatus.RUNNING):
            return
        if self.withheld(job) is not None:
            return
        if checked.profile is job.profile.current:
            factors = checked.factors
        else:  # the profile changed since the check: measure again
            factors = checked_stage_factors(job, rank, rep)
        if factors is not None:
            self.apply(job, rank, factors)

    def forget(self, job_id: str) -> None:
        """Nothing to do: the slow stages are kept on the job.

        The facade cancels its re-solves.
        """

    def apply(self, job: Job, rank: RankInfo, factors: dict[int, float]) -> None:
        """Feed one iteration's per-stage factors (:func:`checked_stage_factors`) to the detector."""
        p = rank.data_rank
        slow = job.stragglers
        det = slow.stage_detector
        for stage, factor in factors.items():
            current = slow.stage_flags.get((p, stage))
            event, value = det.observe(p, stage, factor, current)
            if event in (DetectorEvent.SLOW, DetectorEvent.CHANGED):
                slow.stage_flags[(p, stage)] = value
            elif event is DetectorEvent.RECOVERED:
                slow.stage_flags.pop((p, stage), None)
            if event is not None:
                # Decide once every stage has reported this iteration too: a uniformly slow
                # pipeline must not look like one slow stage because its ranks report apart.
                slow.stage_pending[p] = max(slow.stage_pending.get(p, 0), det.seen[(p, stage)])
        pending = slow.stage_pending.get(p)
        if pending is not None and det.caught_up(p, pending):
            del slow.stage_pending[p]
            self.changed(job, p)

    def changed(self, job: Job, p: int) -> None:
        """Re-solve pipeline ``p``'s frontier for its slow stages, or drop it when none is left.

        When every stage of the pipeline is slow, the pipeline is simply slower (its frontier
        scales in time); the iteration-time detector handles that without a re-solve.
        """
        profile = job.profile.current
        assert profile is not None
        slow = job.stragglers
        factors = {s: f for (q, s), f in slow.stage_flags.items() if q == p}
        links = {(b, d): t for (q, b, d), t in slow.links.flags.items() if q == p}
        if len(factors) >= profile.stages:
            factors = {}  # every stage slow: the iteration-time detector's (a slower pipeline)
        if not factors and not links:
            if p in slow.slow_stages:
                every = any(q == p for q, _ in slow.stage_flags)
                why = (
                    f"pipeline {p}: every stage is slow; handled as a slow pipeline"
                    if every
                    else f"pipeline {p}: its stages and links are back to their profiled speed"
                )
                self.drop(job, p, links=False)
                self.deployer.replan(job, why, ReplanKind.SLOW_STAGE_RECOVERED)
            return
        old = slow.slow_stages.get(p)
        if old is not None and old.factors == factors and old.links == links:
            return
        key = stage_solve_key(job, p)
        self.ctx.solver.cancel(key, "superseded by newer slow-stage factors")
        state = SlowStages(factors, generation=(old.generation + 1) if old else 1, links=links)
        if old is not None and old.status is SlowStageStatus.READY:
            # Keep running the previous re-solved plan until the new one is ready.
            state.frontier, state.status = old.frontier, SlowStageStatus.READY
            state.solve_seconds, state.wall_seconds = old.solve_seconds, old.wall_seconds
        slow.slow_stages[p] = state
        for stage, f in factors.items():
            profile = profile.scaled(stage, time_factor=f)
        if links:
            profile = with_transfer_times(profile, links)
        log.info(
            "job %s: pipeline %d has slow stage(s) or link(s) %s; re-solving its frontier",
            job.id,
            p,
            state.describe(),
        )
        self._solve(job, p, state.generation, profile.to_csv())

    def _solve(self, job: Job, p: int, generation: int, profile_csv: str) -> None:
        ctx, key = self.ctx, stage_solve_key(job, p)
        slow = job.stragglers
        t0 = time.perf_counter()

        def current() -> SlowStages | None:
            cur = slow.slow_stages.get(p)
            return cur if cur is not None and cur.generation == generation else None

        def on_done(doc: str, seconds: float, frontier: Frontier) -> None:
            cur = current()
            if job.id not in ctx.jobs or cur is None:
                return
            cur.frontier = frontier
            cur.status, cur.plans, cur.error = SlowStageStatus.READY, {}, None
            cur.solve_seconds, cur.wall_seconds = seconds, time.perf_counter() - t0
            ctx.metrics.stage_resolve_seconds.observe(seconds)
            slow.detector.reset(p)
            own_time = float(frontier.times[0])
            slow.stragglers = {
                **{q: s for q, s in slow.stragglers.items() if q != p},
                p: Straggler(p, own_time, StragglerSource.SLOW_STAGE, cur.describe()),
            }
            self.deployer.replan(
                job,
                f"pipeline {p} slow {cur.describe()}: frontier re-solved in "
                f"{seconds:.2f} s; its fastest plan takes {own_time:.4g} s",
                ReplanKind.SLOW_STAGE if cur.factors else ReplanKind.SLOW_LINK,
            )

        def on_failed(reason: str) -> None:
            cur = current()
            if cur is None:
                return
            if cur.frontier is None:
                cur.status = SlowStageStatus.FAILED
            cur.error = reason
            log.warning("job %s: re-solving pipeline %d failed: %s", job.id, p, reason)

        def launch() -> None:
            ctx.solver.start(
                key,
                profile_csv,
                job.schedule.to_json(),
                job.spec.blocking_power,
                SolveEvents(lambda pid: None, lambda f: None, on_done, on_failed, decode_frontier),
                tenant=job.row.tenant,
            )

        if not ctx.solver.is_active(key):
            launch()
            return

        async def retry() -> None:
            # The superseded solve holds the key until its worker is reaped.
            while ctx.solver.is_active(key):
                await asyncio.sleep(0.05)
            if job.id in ctx.jobs and current() is not None:
                launch()

        ctx.spawn(retry())

    def drop(self, job: Job, p: int, *, links: bool = True) -> None:
        """Forget pipeline ``p``'s slow stages, their re-solve and their straggler.

        Its slow links too, unless ``links`` is False (they are known slow still).
        """
        slow = job.stragglers
        self.ctx.solver.cancel(stage_solve_key(job, p), "the slow stage recovered")
        slow.slow_stages.pop(p, None)
        for key in [k for k in slow.stage_flags if k[0] == p]:
            del slow.stage_flags[key]
        if links:
            for lk in [k for k in slow.links.flags if k[0] == p]:
                del slow.links.flags[lk]
            slow.links.pending.discard(p)
            if slow.links.detector is not None:
                slow.links.detector.reset(p)
        slow.stragglers = drop_slow_stage_straggler(slow.stragglers, p)
