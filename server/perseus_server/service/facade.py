"""The service's facade: :class:`PerseusService` builds the parts and spans them.

:class:`PerseusService` builds the parts, each given what it calls when it is built, and offers the
operations that span parts. Where one part does the work, the REST and gRPC adapters call that part
(``service.profiles.put(...)``, ``service.registration.register(...)``); the facade has no method
that only forwards.

The parts take and return plain values (dicts shaped as the REST API answers, and the frozen
values of :mod:`perseus_server.domain.values` for the ranks). Everything runs on the server's
event loop (with PostgreSQL, iteration reports are committed in groups on a thread:
:mod:`perseus_server.service.ingest`); solves run in worker processes (see :mod:`perseus_server.runtime.solve_manager`),
and large iteration reports are decoded in one
(:class:`~perseus_server.runtime.parse_pool.ReportPool`) and checked on a thread. State is
written through to the :class:`~perseus_server.domain.store.Store` before a change is
acknowledged, so it survives a killed process.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Hashable
from typing import Any

from perseus.power import SwingBounds
from perseus_common.wire.values import IterationReport
from perseus_server.config import Limits
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.errors import Conflict
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.states import JobActivity, JobState, StreamEnd
from perseus_server.domain.store import Store
from perseus_server.metrics import OTHER, Labels, Metrics
from perseus_server.runtime.hub import PlanHub
from perseus_server.runtime.parse_pool import ReportPool
from perseus_server.runtime.solve_manager import SolveLimits, SolveManager
from perseus_server.runtime.store_errors import ObservesErrors
from perseus_server.runtime.write_limits import WriteLimits
from perseus_server.service.clock_verification import ClockVerification
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.ingest import ReportWriter
from perseus_server.service.job_gauges import JobGauges
from perseus_server.service.job_profiles import Profiles
from perseus_server.service.lifecycle import Lifecycle
from perseus_server.service.measured_power import MeasuredPower
from perseus_server.service.observers import RankHistory
from perseus_server.service.online_profiling import OnlineProfiling
from perseus_server.service.persistence import load_jobs
from perseus_server.service.plans import PlanAnswers, PlanQueries, shape_policy
from perseus_server.service.power import PlanPowers
from perseus_server.service.power_budget import PowerBudget
from perseus_server.service.power_draw import draw_view, why_drawn
from perseus_server.service.registration import Registration
from perseus_server.service.report_checks import (
    ReceivedReport,
    check_before_decoding,
    check_report,
)
from perseus_server.service.reports import Reports
from perseus_server.service.slow_links import SlowLinks
from perseus_server.service.slow_stages import SlowStageResolver, stage_solve_key
from perseus_server.service.solves import Solves
from perseus_server.service.state import Job, JobTable
from perseus_server.service.stragglers import ProfileChecks, Stragglers
from perseus_server.service.tenants import DEFAULT_TENANT, Tenants
from perseus_server.service.views import Views

__all__ = ["PerseusService", "OFFLOAD_INSTRUCTIONS"]

#: Nodes per job named in ``perseus_ranks_without_clock_control`` (the rest: ``other``).
CLOCK_CONTROL_NODES = 32
#: Reports with more instruction measurements (off-plan instructions and transfers counted too)
#: than this are checked off the event loop.
OFFLOAD_INSTRUCTIONS = 512


class PerseusService:
    """The server's state and operations (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        limits: Limits,
        report_decoder: Callable[[bytes], IterationReport] | None = None,
        ingest_off_loop: bool = False,
    ) -> None:
        """Build the parts of the service, each given what it calls.

        ``report_decoder``: how the report worker decodes a large report's wire bytes (the
        gRPC adapter's decoder); without one, large reports are decoded on a thread.
        ``ingest_off_loop``: commit reports in groups on a thread of their own
        (:class:`~perseus_server.service.ingest.ReportWriter`; the store must be safe to use
        from two threads: PostgreSQL's is).
        """
        self.store = store
        self.limits = limits
        self.hub = PlanHub(limits.max_streams_per_credential)
        self.solver = SolveManager(
            limits.max_concurrent_solves,
            limits=SolveLimits(
                limits.solve_memory_bytes, limits.solve_seconds, limits.max_queued_solves
            ),
        )
        self.jobs = JobTable()
        # Profile checks: the stragglers consult them, measured power withholds its saved
        # figures while a job's profile does not describe it, the status and metrics show them.
        checks = ProfileChecks(limits.profile_mismatch_band, limits.profile_mismatch_iterations)
        # One measured-power account: reports feed it, the status view and /metrics read it.
        measured = MeasuredPower(self.jobs, withheld=checks.reason)
        self.metrics = Metrics(
            self._jobs_gauge,
            self._connected_gauge,
            self._registered_gauge,
            solve_limit=limits.solve_seconds,
            job_energy=measured,
            without_clock_control=self._clock_control_gauge,
        )
        if isinstance(store, ObservesErrors):  # writes refused (a full disk), counted
            store.on_error = lambda kind: self.metrics.store_errors.inc(kind=kind)
        ctx = ServiceContext(store, limits, self.jobs, self.hub, self.solver, self.metrics)
        self.ctx = ctx
        self.tenants = Tenants(ctx)
        self.tenants.load()
        #: Each tenant's REST writes, paced (the gate takes one per write).
        self.write_limits = WriteLimits(limits.tenant_write_rate, limits.tenant_write_burst)
        self.powers = PlanPowers()
        # Job lifecycles: a change (idle, finished, active again) recomputes the power budget,
        # which covers active jobs only.
        self.lifecycle = Lifecycle(ctx, limits.idle_after_seconds, changed=self._lifecycle_changed)
        # The deployer builds its budget, giving it itself: the budget re-decides the jobs
        # whose share changes, the deployer asks it for each job's policy.
        self.deployer = Deployer(
            ctx,
            lambda d: PowerBudget(
                ctx,
                d,
                self.powers,
                participates=lambda job: self.lifecycle.drawing(job.id),
                tenants=self.tenants,
                why_out=lambda job: why_drawn(job, self.lifecycle.active(job.id)),
            ),
        )
        self.power_budget = self.deployer.budget
        self.profiles = Profiles(ctx)
        self.solves = Solves(ctx, self.deployer, tenants=lambda: len(self.tenants.ids()))
        self.plans = PlanQueries(ctx, self.powers)
        self.answers = PlanAnswers()
        self.slow_stages = SlowStageResolver(ctx, self.deployer, withheld=checks.reason)
        self.stragglers = Stragglers(ctx, self.deployer, self.slow_stages, checks)
        self.profiling = OnlineProfiling(ctx, self.deployer, self.profiles, self.solves)
        # An accepted report goes to each of these in order (the detectors stand aside while
        # a job is profiled; the profile checks, which the stragglers update, pause the slow
        # stages and links): a new detector is one more observer here.
        self.reports = Reports(
            ctx,
            [
                RankHistory(),
                ClockVerification(self.metrics.off_plan_instructions),
                measured,
                self.stragglers,
                SlowLinks(ctx, self.slow_stages, self.stragglers),
                self.slow_stages,
                self.profiling,
            ],
        )
        self.report_pool = ReportPool(report_decoder) if report_decoder is not None else None
        self.report_writer = ReportWriter(self.reports, store) if ingest_off_loop else None
        self.registration = Registration(ctx, self.deployer, self.lifecycle)
        self.views = Views(
            ctx,
            self.deployer,
            self.solves,
            measured,
            time.time(),
            power_share=self.power_budget.job_share,
            power_draw=lambda job: draw_view(job, self.lifecycle.active(job.id)),
            lifecycle=self.lifecycle.view,
            profile_mismatch=checks.view,
        )
        # The gauges an operator alerts on (lifecycle, budget, mismatch, slowdown, world size).
        self.metrics.add_job_gauges(
            JobGauges(ctx, self.deployer, self.lifecycle, self.power_budget, checks, self.tenants)
        )

    def _lifecycle_changed(self, job_id: str, state: JobActivity, why: str) -> None:
        self.power_budget.request_recompute(f"job {job_id} is {state} ({why})")

    # --- lifecycle -------------------------------------------------------------------------------

    def load(self, *, resume_solves: bool = False) -> None:
        """Rebuild the in-memory state from the store; solves cut short by a restart are failed.

        With ``resume_solves`` (a leader of a shared database), they are started again instead,
        and this server's own solves are left to the next leader when it stops
        (:meth:`Solves.resume`).
        """
        self.tenants.load()
        resumed = load_jobs(self.store, self.jobs, resume=resume_solves)
        self.lifecycle.load()
        self.power_budget.load()
        if resume_solves:
            self.solves.resume(resumed)

    async def shutdown(self) -> None:
        """Stop the service: close the plan streams, stop the solves and the workers.

        The workers are the worker pools and the report writer.
        """
        self.hub.close(None, StreamEnd.SHUTDOWN)
        await self.solver.shutdown()
        self.profiles.pool.close()
        if self.report_pool is not None:
            self.report_pool.close()
        if self.report_writer is not None:
            self.report_writer.close()

    # --- metrics ---------------------------------------------------------------------------------

    def _jobs_gauge(self) -> dict[Labels, float]:
        counts: dict[Labels, float] = {}
        for job in self.jobs:
            key = (("state", str(job.state())),)
            counts[key] = counts.get(key, 0) + 1
        return counts or {(("state", str(JobState.CREATED)),): 0}

    def _connected_gauge(self) -> dict[Labels, float]:
        counts = self.hub.connected_counts()
        return {(("perseus_job", j),): float(counts.get(j, 0)) for j in self.jobs.ids()}

    def _registered_gauge(self) -> dict[Labels, float]:
        return {
            (("perseus_job", j.id),): float(len(j.ranks.by_global))
            for j in self.jobs
            if j.ranks.by_global
        }

    def _clock_control_gauge(self) -> dict[Labels, float]:
        """Per job with registered ranks and node: how many ranks have no clock control.

        The node is the ranks' host name; the count is of ranks that say their clock control
        is unavailable. The nodes that have any, at most ``CLOCK_CONTROL_NODES`` per job
        (the rest summed as ``other``); a job with none has one sample, ``node=""``, 0.
        """
        out: dict[Labels, float] = {}
        for j in self.jobs:
            if not j.ranks.by_global:
                continue
            nodes: dict[str, int] = {}
            for rank_id, rank in j.ranks.by_id.items():
                if j.ranks.clock_control.get(rank_id, ("",))[0] == "unavailable":
                    nodes[rank.hostname] = nodes.get(rank.hostname, 0) + 1
            if not nodes:
                out[(("perseus_job", j.id), ("node", ""))] = 0.0
                continue
            ranked = sorted(nodes.items(), key=lambda kv: (-kv[1], kv[0]))
            for node, n in ranked[:CLOCK_CONTROL_NODES]:
                out[(("perseus_job", j.id), ("node", node))] = float(n)
            rest = sum(n for _, n in ranked[CLOCK_CONTROL_NODES:])
            if rest:
                out[(("perseus_job", j.id), ("node", OTHER))] = float(rest)
        return out

    # --- jobs ------------------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        """A new job of ``tenant``: 409 over the server's job cap or the tenant's quotas."""
        if len(self.jobs) >= self.limits.max_jobs:
            raise Conflict(
                f"the server holds its maximum of {self.limits.max_jobs} jobs; delete one first",
                field="job_id",
            )
        schedule = spec.validate(self.limits)
        held = sum(j.spec.world_size for j in self.jobs)
        if held + spec.world_size > self.limits.max_gpus:
            raise Conflict(
                f"the server's jobs hold {held} of its maximum of {self.limits.max_gpus} GPUs "
                f"and this one needs {spec.world_size} (world_size); delete a job first",
                field="max_gpus",
            )
        self.tenants.admit(tenant, spec)
        job_id = secrets.token_hex(8)
        row = self.store.add_job(job_id, spec, tenant)
        self.jobs.add(Job(row=row, schedule=schedule))
        self.lifecycle.added(job_id)
        return self.views.job(job_id)

    def tenant_of(self, job_id: str) -> str | None:
        """The tenant of a stored job (None: no such job)."""
        return self.jobs.get(job_id).row.tenant if job_id in self.jobs else None

    def jobs_page(
        self, limit: int = 100, after: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """``GET /jobs``: at most ``limit`` summaries after job ``after``, and ``next``.

        ``tenant``: that tenant's jobs only.
        """
        jobs, cursor = self.views.jobs(limit, after, tenant)
        page: dict[str, Any] = {"jobs": jobs}
        if cursor is not None:
            page["next"] = cursor
        return page

    async def delete_job(self, job_id: str) -> None:
        """Delete the job: cancel its solves, close its streams, forget it everywhere.

        The store and every part of the service forget it.
        """
        job = self.jobs.get(job_id)
        self.solver.cancel(job_id, "the job was deleted")
        for p in list(job.stragglers.slow_stages):
            self.solver.cancel(stage_solve_key(job, p), "the job was deleted")
        self.hub.close(job_id, StreamEnd.DELETED)
        self.jobs.remove(job_id)
        self.store.delete_job(job.id)
        self.powers.forget(job.id)
        self.deployer.floors.forget(job.id)
        self.answers.forget(job.id)
        self.lifecycle.removed(job.id)
        self.reports.forget(job.id)
        self.power_budget.job_removed(job.id)
        self.metrics.drop_job(job.id)

    def finish_rank(self, job_id: str, rank_id: str) -> tuple[bool, int, int]:
        """``FinishRank``: a rank's training ended cleanly.

        Returns (job finished, ranks that said so, ranks registered).
        """
        return self.lifecycle.rank_finished(job_id, rank_id)

    def finish_job(self, job_id: str) -> dict[str, Any]:
        """``POST /jobs/{id}/finish``: the job leaves the power budget; returns its lifecycle."""
        return self.lifecycle.finish(job_id)

    # --- profiles and frontiers ------------------------------------------------------------------

    def frontier_status(self, job_id: str, *, points: bool = True) -> dict[str, Any]:
        """``GET /jobs/{id}/frontier``: the solve's state, its points with their powers."""
        out = self.solves.status(job_id, points=points)
        return self.powers.annotate_points(self.jobs.get(job_id), out)

    # --- plans -----------------------------------------------------------------------------------

    def cached_plan(self, job_id: str, query: Hashable) -> bytes | None:
        """The answer :meth:`query_plan` built for ``query``, while it still stands; None when none.

        It stands while the job's frontier and profile are still the ones it was built from
        (:class:`PlanAnswers`); None also when there is no such job. The caller has
        authorized the request (the REST gate).
        """
        job = self.jobs.find(job_id)
        return None if job is None else self.answers.get(job, query)

    def query_plan(
        self,
        job_id: str,
        policy: PlanPolicy,
        *,
        steps: bool = False,
        query: Hashable = None,
        swing: SwingBounds | None = None,
    ) -> bytes:
        """The plan ``policy`` selects as a JSON document (bytes).

        Kept for :meth:`cached_plan` under ``query`` when given. Not kept: the cost policy
        without its ``max_power`` (the job's comes from its ranks, which register at any
        time).
        """
        job = self.jobs.get(job_id)
        body = self.plans.query(job_id, shape_policy(job, policy), steps=steps, swing=swing)
        if query is not None and not (
            policy.kind == "eta" and all(k != "max_power" for k, _ in policy.options)
        ):
            self.answers.put(job, query, body)
        return body

    def deploy(
        self, job_id: str, policy: PlanPolicy, pipelines: list[int] | None
    ) -> dict[str, Any]:
        """``PUT /jobs/{id}/plan``: set the default policy (or pin some pipelines) and push."""
        return self.deployer.deploy(job_id, self._shaped(job_id, policy), pipelines)

    def _shaped(self, job_id: str, policy: PlanPolicy) -> PlanPolicy:
        """``policy`` with what the job supplies (:func:`shape_policy`)."""
        return shape_policy(self.jobs.get(job_id), policy)

    # --- stragglers ------------------------------------------------------------------------------

    def report_straggler(
        self, job_id: str, pipeline: int, slowdown: float | None, iteration_time: float | None
    ) -> dict[str, Any]:
        """Report pipeline ``pipeline`` as a straggler and replan; returns the job's status."""
        self.stragglers.report(job_id, pipeline, slowdown, iteration_time)
        return self.views.status(job_id)

    def clear_stragglers(self, job_id: str, pipeline: int | None) -> dict[str, Any]:
        """Clear the job's stragglers and replan; returns the job's status.

        ``pipeline``: the one pipeline to clear (None: all).
        """
        self.stragglers.clear(job_id, pipeline)
        return self.views.status(job_id)

    # --- iteration reports -----------------------------------------------------------------------

    async def ingest_report(self, received: ReceivedReport) -> tuple[int, int]:
        """Decode, check, store and observe one report; returns (new, duplicates).

        A re-sent report is acknowledged and dropped.

        The job, the rank and the number of transfers are checked first, before anything is
        decoded (:func:`check_before_decoding`). A report of more than ``OFFLOAD_INSTRUCTIONS``
        measurements, off-plan instructions and transfers together (``received.size``) stays
        off the loop: it is decoded into columns in the report worker process from its wire
        bytes (else decoded on a thread), and checked on a thread with array operations; the
        loop only stores it and hands it to the observers.
        """
        check_before_decoding(self.jobs, received.job_id, received.rank_id, received.transfers)
        if received.size > OFFLOAD_INSTRUCTIONS:
            if self.report_pool is not None:
                rep = await self.report_pool.decode(received.wire, received.decode)
            else:
                rep = await asyncio.to_thread(received.decode)
            checked = await asyncio.to_thread(check_report, self.jobs, self.limits, 0, rep)
        else:
            checked = check_report(self.jobs, self.limits, 0, received.decode())
        if self.report_writer is not None:
            return await self.report_writer.record(checked)
        return self.reports.record_counted([checked])
