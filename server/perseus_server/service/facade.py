"""The service's facade: :class:`PerseusService` composes the parts and offers the operations
the REST and gRPC adapters call. It takes and returns plain values (dicts shaped as the REST
API answers, and the frozen values of :mod:`perseus_server.domain.values` for the ranks).

Everything runs on the server's event loop; solves run in worker processes (see
:mod:`perseus_server.runtime.solve_manager`), and large iteration reports are decoded in one
(:class:`~perseus_server.runtime.parse_pool.ReportPool`) and checked on a thread. State is written through to the :class:`Store` before a change
is acknowledged, so it survives a killed process.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from perseus.frontier import Frontier
from perseus.profiles import Profile
from perseus_server.config import Limits
from perseus_server.domain.errors import Conflict
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.states import JobState, StreamEnd
from perseus_server.domain.values import (
    IterationReport,
    PlanUpdate,
    RankRegistration,
    RegisteredRank,
)
from perseus_server.metrics import Labels, Metrics
from perseus_server.policy.detectors import DetectorSettings
from perseus_server.policy.planner import PlanPolicy
from perseus_server.policy.profiling_scan import DEFAULT_TOLERANCE
from perseus_server.runtime.hub import PlanHub, Subscriber
from perseus_server.runtime.parse_pool import ReportPool
from perseus_server.runtime.solve_manager import SolveLimits, SolveManager
from perseus_server.runtime.store import Store
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.job_profiles import Profiles
from perseus_server.service.measured_power import MeasuredPower
from perseus_server.service.online_profiling import OnlineProfiling
from perseus_server.service.persistence import load_jobs
from perseus_server.service.plans import PlanQueries
from perseus_server.service.power import PlanPowers
from perseus_server.service.power_budget import PowerBudget
from perseus_server.service.registration import Registration
from perseus_server.service.reports import Reports
from perseus_server.service.slow_stages import SlowStageResolver, stage_solve_key
from perseus_server.service.solves import Solves
from perseus_server.service.state import Job, JobTable
from perseus_server.service.stragglers import Stragglers
from perseus_server.service.views import Views

__all__ = ["PerseusService", "OFFLOAD_INSTRUCTIONS"]

#: Reports with more instruction measurements than this are checked off the event loop.
OFFLOAD_INSTRUCTIONS = 512


class PerseusService:
    """The server's state and operations (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        limits: Limits,
        report_decoder: Callable[[bytes], IterationReport] | None = None,
    ) -> None:
        """``report_decoder``: how the report worker decodes a large report's wire bytes (the
        gRPC adapter's decoder); without one, large reports are decoded on a thread."""
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
        self.metrics = Metrics(
            self._jobs_gauge,
            self._connected_gauge,
            self._registered_gauge,
            without_clock_control=self._clock_control_gauge,
        )
        ctx = ServiceContext(store, limits, self.jobs, self.hub, self.solver, self.metrics)
        self.ctx = ctx
        self.deployer = Deployer(ctx)
        self.profiles = Profiles(ctx)
        self.solves = Solves(ctx, self.deployer)
        self.powers = PlanPowers()
        self.plans = PlanQueries(ctx, self.powers)
        self.power_budget = PowerBudget(ctx, self.deployer, self.powers)
        self.deployer.budget_policy = self.power_budget.policy_for
        self.deployer.stragglers_changed = self.power_budget.stragglers_changed
        self.deployer.deployment_power = self.power_budget.deployment_power
        self.slow_stages = SlowStageResolver(ctx, self.deployer)
        self.stragglers = Stragglers(ctx, self.deployer, self.slow_stages)
        self.profiling = OnlineProfiling(ctx, self.deployer, self.profiles, self.solves)
        # One measured-power account: reports feed it, the status view and /metrics read it.
        measured = MeasuredPower(ctx)
        ctx.metrics.job_energy = measured
        self.reports = Reports(ctx, self.stragglers, self.slow_stages, self.profiling, measured)
        self.report_pool = ReportPool(report_decoder) if report_decoder is not None else None
        self.registration = Registration(ctx, self.deployer)
        self.views = Views(ctx, self.deployer, self.solves, measured, time.time())
        self.views.power_share = self.power_budget.job_share

    # --- lifecycle -------------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the in-memory state from the store; solves cut short by a restart are failed."""
        load_jobs(self.store, self.jobs)
        self.power_budget.load()

    async def shutdown(self) -> None:
        self.hub.close(None, StreamEnd.SHUTDOWN)
        await self.solver.shutdown()
        self.profiles.pool.close()
        if self.report_pool is not None:
            self.report_pool.close()

    # --- metrics ---------------------------------------------------------------------------------

    def _jobs_gauge(self) -> dict[Labels, float]:
        counts: dict[Labels, float] = {}
        for job in self.jobs:
            key = (("state", str(job.state())),)
            counts[key] = counts.get(key, 0) + 1
        return counts or {(("state", str(JobState.CREATED)),): 0}

    def _connected_gauge(self) -> dict[Labels, float]:
        return {(("job", j),): float(n) for j, n in self.hub.connected_counts().items()}

    def _registered_gauge(self) -> dict[Labels, float]:
        return {
            (("job", j.id),): float(len(j.ranks.by_global)) for j in self.jobs if j.ranks.by_global
        }

    def _clock_control_gauge(self) -> dict[Labels, float]:
        """Per job with registered ranks: how many say their clock control is unavailable."""
        return {
            (("job", j.id),): float(
                sum(
                    1
                    for rank_id in j.ranks.by_id
                    if j.ranks.clock_control.get(rank_id, ("",))[0] == "unavailable"
                )
            )
            for j in self.jobs
            if j.ranks.by_global
        }

    # --- jobs ------------------------------------------------------------------------------------

    def create_job(self, spec: JobSpec) -> dict[str, Any]:
        if len(self.jobs) >= self.limits.max_jobs:
            raise Conflict(
                f"the server holds its maximum of {self.limits.max_jobs} jobs; delete one first",
                field="job_id",
            )
        schedule = spec.validate(self.limits)
        job_id = secrets.token_hex(8)
        row = self.store.add_job(job_id, spec)
        self.jobs.add(Job(row=row, schedule=schedule))
        return self.job_view(job_id)

    def list_jobs(self, limit: int = 100, after: str | None = None) -> list[dict[str, Any]]:
        """A page of job summaries (see :meth:`jobs_page`)."""
        return self.views.jobs(limit, after)[0]

    def jobs_page(self, limit: int = 100, after: str | None = None) -> dict[str, Any]:
        """``GET /jobs``: at most ``limit`` summaries after job ``after``, and ``next``."""
        jobs, cursor = self.views.jobs(limit, after)
        page: dict[str, Any] = {"jobs": jobs}
        if cursor is not None:
            page["next"] = cursor
        return page

    def job_view(self, job_id: str) -> dict[str, Any]:
        return self.views.job(job_id)

    async def delete_job(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        self.solver.cancel(job_id, "the job was deleted")
        for p in list(job.stragglers.slow_stages):
            self.solver.cancel(stage_solve_key(job, p), "the job was deleted")
        self.hub.close(job_id, StreamEnd.DELETED)
        self.jobs.remove(job_id)
        self.store.delete_job(job.id)
        self.powers.forget(job.id)
        self.power_budget.job_removed(job.id)
        self.metrics.off_plan_instructions.drop(job=job.id)

    # --- profiles and frontiers ------------------------------------------------------------------

    async def put_profile(self, job_id: str, body: bytes, content_type: str) -> dict[str, Any]:
        return await self.profiles.put(job_id, body, content_type)

    def profile_summary(self, job_id: str) -> dict[str, Any]:
        return self.profiles.summary(job_id)

    def get_profile(self, job_id: str) -> Profile:
        return self.profiles.get(job_id)

    def start_frontier(self, job_id: str) -> dict[str, Any]:
        return self.solves.start(job_id)

    def cancel_frontier(self, job_id: str) -> dict[str, Any]:
        return self.solves.cancel(job_id)

    def frontier_status(self, job_id: str, *, points: bool = True) -> dict[str, Any]:
        out = self.solves.status(job_id, points=points)
        return self.powers.annotate_points(self.jobs.get(job_id), out)

    def frontier_of(self, job_id: str) -> tuple[Frontier, list[int]]:
        return self.solves.frontier_of(job_id)

    # --- plans -----------------------------------------------------------------------------------

    def query_plan(self, job_id: str, policy: PlanPolicy, *, steps: bool = False) -> bytes:
        """The plan ``policy`` selects as a JSON document (bytes, cached per frontier point)."""
        return self.plans.query(job_id, self._shaped(job_id, policy), steps=steps)

    def deploy(
        self, job_id: str, policy: PlanPolicy, pipelines: list[int] | None
    ) -> dict[str, Any]:
        """``PUT /jobs/{id}/plan``: set the default policy (or pin some pipelines) and push."""
        return self.deployer.deploy(job_id, self._shaped(job_id, policy), pipelines)

    def _shaped(self, job_id: str, policy: PlanPolicy) -> PlanPolicy:
        """A ``power_budget`` policy (watts, whole job) for the job's pipeline copies."""
        if policy.kind != "power_budget":
            return policy
        spec = self.jobs.get(job_id).spec
        return PlanPolicy(policy.kind, policy.value, spec.data_parallel * spec.tensor_parallel)

    # --- the cluster power budget ----------------------------------------------------------------

    def put_power_budget(self, watts: float, policy: str, jobs: list[str] | None) -> dict[str, Any]:
        return self.power_budget.put(watts, policy, jobs)

    def power_budget_view(self) -> dict[str, Any]:
        return self.power_budget.view()

    def delete_power_budget(self) -> None:
        self.power_budget.delete()

    def deployment_view(self, job_id: str) -> dict[str, Any] | None:
        return self.deployer.view(self.jobs.get(job_id))

    # --- stragglers ------------------------------------------------------------------------------

    def report_straggler(
        self, job_id: str, pipeline: int, slowdown: float | None, iteration_time: float | None
    ) -> dict[str, Any]:
        self.stragglers.report(job_id, pipeline, slowdown, iteration_time)
        return self.status(job_id)

    def clear_stragglers(self, job_id: str, pipeline: int | None) -> dict[str, Any]:
        self.stragglers.clear(job_id, pipeline)
        return self.status(job_id)

    def set_detector(self, job_id: str, settings: DetectorSettings) -> None:
        self.stragglers.set_detector(job_id, settings)

    # --- ranks -----------------------------------------------------------------------------------

    def register_rank(self, req: RankRegistration) -> RegisteredRank:
        return self.registration.register(req)

    def subscribe(
        self, job_id: str, rank_id: str, credential: str = ""
    ) -> tuple[Subscriber, PlanUpdate | None]:
        return self.registration.subscribe(job_id, rank_id, credential)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.registration.unsubscribe(sub)

    def record_reports(self, reports: Sequence[IterationReport]) -> int:
        """Validate and store a batch of iteration reports (all or nothing); returns how many."""
        return self.reports.record(reports)

    async def ingest_report(
        self,
        decode: Callable[[], IterationReport],
        size: int,
        serialize: Callable[[], bytes] | None = None,
    ) -> tuple[int, int]:
        """Decode, validate and store one report; returns (new, duplicates): a re-sent report
        is acknowledged and dropped.

        A report of more than ``OFFLOAD_INSTRUCTIONS`` measurements and off-plan instructions
        together (``size``) stays off the loop: given ``serialize`` (its wire bytes), it is
        decoded into columns in the report worker process (else by ``decode`` on a thread), and
        checked on a thread with array operations; the loop only stores it.
        """
        if size > OFFLOAD_INSTRUCTIONS:
            if serialize is not None and self.report_pool is not None:
                rep = await self.report_pool.decode(serialize, decode)
            else:
                rep = await asyncio.to_thread(decode)
            checked = await asyncio.to_thread(self.reports.check, 0, rep)
        else:
            checked = self.reports.check(0, decode())
        return self.reports.record_counted([checked])

    # --- online profiling ------------------------------------------------------------------------

    def start_profiling(
        self,
        job_id: str,
        frequencies: list[int] | None,
        warmup: int,
        iterations: int,
        stop_after_rises: int,
        tolerance: float = DEFAULT_TOLERANCE,
    ) -> dict[str, Any]:
        return self.profiling.start(
            job_id, frequencies, warmup, iterations, stop_after_rises, tolerance
        )

    def abort_profiling(self, job_id: str) -> dict[str, Any]:
        return self.profiling.abort(job_id)

    def profiling_status(self, job_id: str) -> dict[str, Any]:
        return self.profiling.status(job_id)

    # --- status ----------------------------------------------------------------------------------

    def status(self, job_id: str) -> dict[str, Any]:
        return self.views.status(job_id)

    def health(self) -> dict[str, Any]:
        return self.views.health()
