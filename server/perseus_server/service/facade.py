"""The service's facade: :class:`PerseusService` builds the parts and is the adapters' one door.

:class:`PerseusService` builds the parts, each given what it calls when it is built, and offers
every operation the REST routes and gRPC methods call: those that span parts, and those one part
does (``put_profile``, ``register_rank``: a line that hands the call on). The adapters never call
a part or the store (``tests/test_service_door.py``), so a part can change behind the facade
without an adapter noticing. Tenants, the power budget and credentials are in its base class,
:class:`~perseus_server.service.facade_admin.AdministrationFacade`.

The parts take and return plain values (dicts shaped as the REST API answers, and the frozen
values of :mod:`perseus_common.wire.values` for the ranks). Everything runs on the server's
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
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from perseus.frontier import Frontier
from perseus.power import SwingBounds
from perseus.profiles import Profile
from perseus_common.wire.values import (
    IterationReport,
    PlanUpdate,
    RankRegistration,
    RegisteredRank,
)
from perseus_server.config import Limits, ZeusConfig
from perseus_server.decisions.detectors import DetectorSettings
from perseus_server.domain.errors import Conflict
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.states import JobActivity, StreamEnd
from perseus_server.domain.store import Store
from perseus_server.metrics import Metrics
from perseus_server.runtime.hub import PlanHub, Subscriber
from perseus_server.runtime.parse_pool import ReportPool
from perseus_server.runtime.solve_manager import SolveLimits, SolveManager
from perseus_server.runtime.store_errors import ObservesErrors
from perseus_server.runtime.write_limits import WriteLimits
from perseus_server.service.budget_draw import draw_view, why_drawn
from perseus_server.service.clock_verification import ClockVerification
from perseus_server.service.context import ServiceContext
from perseus_server.service.credentials import Credentials, Scope
from perseus_server.service.deployment import Deployer
from perseus_server.service.facade_admin import AdministrationFacade
from perseus_server.service.ingest import ReportWriter
from perseus_server.service.job_gauges import (
    JobGauges,
    clock_control_gauge,
    connected_gauge,
    jobs_gauge,
    registered_gauge,
)
from perseus_server.service.job_profiles import Profiles
from perseus_server.service.lifecycle import Lifecycle
from perseus_server.service.measured_power import MeasuredPower
from perseus_server.service.observers import RankHistory
from perseus_server.service.online_profiling import OnlineProfiling
from perseus_server.service.persistence import load_jobs
from perseus_server.service.plan_powers import PlanPowers
from perseus_server.service.plans import PlanQueries
from perseus_server.service.power_budget import PowerBudget
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
from perseus_server.service.views import STATUS_RANKS, Views
from perseus_server.service.zeus import ZeusRuns

__all__ = ["PerseusService", "OFFLOAD_INSTRUCTIONS"]

#: Reports with more instruction measurements (off-plan instructions and transfers counted too)
#: than this are checked off the event loop.
OFFLOAD_INSTRUCTIONS = 512


class PerseusService(AdministrationFacade):
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
            lambda: jobs_gauge(self.jobs),
            lambda: connected_gauge(self.jobs, self.hub),
            lambda: registered_gauge(self.jobs),
            solve_limit=limits.solve_seconds,
            job_energy=measured,
            without_clock_control=lambda: clock_control_gauge(self.jobs),
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

    # --- jobs ------------------------------------------------------------------------------------

    def create_job(
        self, spec: JobSpec, tenant: str = DEFAULT_TENANT, credentials: Credentials | None = None
    ) -> dict[str, Any]:
        """A new job of ``tenant``: 409 over the server's job cap or the tenant's quotas.

        With ``credentials`` that require a token, the job's rank credential is issued in the
        same transaction (its secret, ``rank_credential``, is in the answer only).
        """
        if credentials is None or not credentials.enabled:
            return self._create_job(spec, tenant)
        with self.store.transaction():
            view = self._create_job(spec, tenant)
            issued = credentials.issue(Scope.RANK, str(view["id"]))
        return {**view, "rank_credential": issued.secret}

    def _create_job(self, spec: JobSpec, tenant: str) -> dict[str, Any]:
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

    def job(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/{id}``: the job's description, state and revisions."""
        return self.views.job(job_id)

    def require_job(self, job_id: str) -> None:
        """Nothing when the job exists; 404 naming ``job_id`` otherwise."""
        self.jobs.get(job_id)

    def job_stages(self, job_id: str) -> int:
        """The number of stages of the job's schedule (its model's stages); 404 for no such job."""
        return self.jobs.get(job_id).schedule.stages

    def status(
        self, job_id: str, ranks: int = STATUS_RANKS, after: int | None = None
    ) -> dict[str, Any]:
        """``GET /jobs/{id}/status``: the job's live state, ``ranks`` ranks' detail after ``after``."""
        return self.views.status(job_id, ranks, after)

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: whether the server answers, its jobs and uptime."""
        return self.views.health()

    def metrics_text(self, tenant: str | None = None) -> str:
        """``GET /metrics`` in the Prometheus text format (``tenant``: its jobs' series only)."""
        if tenant is None:
            return self.metrics.render()
        mine = {j.id for j in self.jobs if j.row.tenant == tenant}
        return self.metrics.render_for(mine, tenant)

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
        self.plans.forget(job.id)
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

    async def put_profile(self, job_id: str, body: bytes, content_type: str) -> dict[str, Any]:
        """``PUT /jobs/{id}/profile``: parse, check and store the job's new profile."""
        return await self.profiles.put(job_id, body, content_type)

    def profile(self, job_id: str) -> Profile:
        """The job's stored profile (404 without one)."""
        return self.profiles.get(job_id)

    def start_profiling(
        self,
        job_id: str,
        frequencies: list[int] | None,
        warmup: int,
        iterations: int,
        stop_after_rises: int,
        tolerance: float,
    ) -> dict[str, Any]:
        """``POST /jobs/{id}/profiling``: start an online profiling scan."""
        return self.profiling.start(
            job_id, frequencies, warmup, iterations, stop_after_rises, tolerance
        )

    def profiling_status(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/{id}/profiling``: the scan's progress (404: never started)."""
        return self.profiling.status(job_id)

    def abort_profiling(self, job_id: str) -> dict[str, Any]:
        """``DELETE /jobs/{id}/profiling``: stop a running scan."""
        return self.profiling.abort(job_id)

    def start_solve(self, job_id: str) -> dict[str, Any]:
        """``POST /jobs/{id}/frontier``: start computing the job's frontier."""
        return self.solves.start(job_id)

    def cancel_solve(self, job_id: str) -> dict[str, Any]:
        """``DELETE /jobs/{id}/frontier``: stop a running computation (409 when none runs)."""
        return self.solves.cancel(job_id)

    def frontier_of(self, job_id: str) -> tuple[Frontier, list[int]]:
        """The job's frontier and the points its pipelines run (409 without one)."""
        return self.solves.frontier_of(job_id)

    def frontier_status(self, job_id: str, *, points: bool = True) -> dict[str, Any]:
        """``GET /jobs/{id}/frontier``: the solve's state, its points with their powers."""
        out = self.solves.status(job_id, points=points)
        return self.powers.annotate_points(self.jobs.get(job_id), out)

    # --- plans -----------------------------------------------------------------------------------

    def cached_plan(self, job_id: str, query: Hashable) -> bytes | None:
        """The answer :meth:`query_plan` kept for ``query`` while it stands (None: none).

        The caller has authorized the request (the REST gate); see :meth:`PlanQueries.cached`.
        """
        return self.plans.cached(job_id, query)

    def query_plan(
        self,
        job_id: str,
        given: Mapping[str, Any],
        *,
        steps: bool = False,
        query: Hashable = None,
        swing: SwingBounds | None = None,
    ) -> bytes:
        """``GET /jobs/{id}/plan``: the plan the policy among ``given`` selects, JSON (bytes).

        Kept for :meth:`cached_plan` under ``query`` (see :meth:`PlanQueries.query`).
        """
        return self.plans.query(job_id, given, steps=steps, query=query, swing=swing)

    def deploy(
        self, job_id: str, given: Mapping[str, Any], pipelines: list[int] | None
    ) -> dict[str, Any]:
        """``PUT /jobs/{id}/plan``: set the default policy (or pin some pipelines) and push.

        ``given``: the body's policy and swing fields (:meth:`PlanQueries.deployment_policy`).
        """
        policy = self.plans.deployment_policy(job_id, given, pipelines)
        return self.deployer.deploy(job_id, policy, pipelines)

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

    def set_straggler_detection(self, job_id: str, settings: DetectorSettings) -> None:
        """``PUT /jobs/{id}/straggler-detection``: the job's detector settings."""
        self.stragglers.set_detector(job_id, settings)

    # --- ranks ------------------------------------------------------------------------------------

    def register_rank(self, registration: RankRegistration) -> RegisteredRank:
        """``RegisterRank``: a rank joins its job."""
        return self.registration.register(registration)

    def subscribe(
        self, job_id: str, rank_id: str, credential: str = ""
    ) -> tuple[Subscriber, PlanUpdate | None]:
        """``WatchPlan``: the rank's plan stream and the current plan (None: none yet)."""
        return self.registration.subscribe(job_id, rank_id, credential)

    def zeus_runs(self, config: ZeusConfig) -> ZeusRuns:
        """The Zeus runs over this service (``perseus serve --zeus``), with ``config``."""
        return ZeusRuns(self, config)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """End a plan stream; the job's lifecycle hears that a rank disconnected."""
        self.registration.unsubscribe(subscriber)

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
