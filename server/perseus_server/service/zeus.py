"""Zeus runs: Zeus's pipeline frequency optimizer served from Perseus's plans.

A Zeus client (``zeus.optimizer.pipeline_frequency.PipelineFrequencyOptimizer``) says only its
parallel degrees and a free ``job_metadata`` string. Here that string names a *prototype*: a
Perseus job of the caller's tenant (its name, or its id), made with the ordinary API (profile,
1F1B schedule, blocking power, frontier, plan policy). Each ``register_job`` is a *run*: a new
ordinary job copied from its prototype (its own id, status, lifecycle and share of the power
budget), with ``dp_degree`` x ``tp_degree`` as its data- and tensor-parallel sizes, that takes
the prototype's profile and frontier as they are (nothing is solved again) and deploys them
under the prototype's plan policy.

Every call answers at once but a rank's ``schedule``, which waits (at most ``plan_wait``) for
the run's ranks to register and for the plan the run falls under (its policy, the power budget
and the tenant shares: a budget is recomputed at most ``Limits.budget_recompute_seconds`` after
a run's first rank registers). The first schedule served pins the run's deployment: a Zeus
client fetches its schedule once, so every rank of the run gets the same version; one that is
not ready in time is the max-clock plan (the ranks train at full speed, as Perseus's own clients
fail open), deployed as the run's plan with the reason in its status. Each call counts as
contact for the run's lifecycle: with none for ``Limits.idle_after_seconds`` it goes idle and
leaves the budget, as any job does.

What is kept in memory only (as Zeus's server does): which jobs are Zeus runs and their ranks'
registrations; the jobs themselves are stored as any job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from perseus.schedules import make_schedule
from perseus_common.wire.values import RankRegistration
from perseus_server.config import ZeusConfig
from perseus_server.domain.errors import ApiError, BadRequest, Conflict, NotFound
from perseus_server.domain.rows import FrontierRow
from perseus_server.domain.states import DeploymentKind, SolveStatus
from perseus_server.service.state import Deployment, Job, RankPlans

if TYPE_CHECKING:
    from perseus_server.service.facade import PerseusService

__all__ = ["ZeusJobInfo", "ZeusRankInfo", "ZeusRuns", "zeus_order_problem"]

log = logging.getLogger("perseus.server")

#: How often a waiting schedule looks again for its plan (s).
POLL_SECONDS = 0.05
#: Zeus's request field for each of Perseus's registration fields.
_ZEUS_FIELDS = {
    "global_rank": "rank",
    "pipeline_rank": "pp_rank",
    "data_rank": "dp_rank",
    "tensor_rank": "tp_rank",
    "supported_clocks_mhz": "available_frequencies",
    "profile.frequency": "available_frequencies",
}


@dataclass(frozen=True)
class ZeusJobInfo:
    """Zeus's ``JobInfo``: what rank 0 sends to ``register_job``."""

    job_id: str
    pp_degree: int
    dp_degree: int
    tp_degree: int
    world_size: int
    job_metadata: str | None


@dataclass(frozen=True)
class ZeusRankInfo:
    """Zeus's ``RankInfo``: what every rank sends to ``register_rank``."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    available_frequencies: tuple[int, ...]


@dataclass
class _Run:
    """One Zeus run: its job, prototype and ranks, and the schedule it was served."""

    job_id: str
    tenant: str
    prototype: str
    world_size: int
    ranks: dict[int, ZeusRankInfo] = field(default_factory=dict)
    rank_ids: dict[int, str] = field(default_factory=dict)
    all_registered: asyncio.Event = field(default_factory=asyncio.Event)
    first_registered: float | None = None
    #: The deployment the run's ranks were served (pinned by the first schedule served) and,
    #: for a plan, each pipeline's per-rank steps under it.
    served: Deployment | None = None
    plans: list[RankPlans] = field(default_factory=list)
    results: int = 0


def zeus_order_problem(job: Job) -> str | None:
    """Why ``job``'s schedule is not the one a Zeus client runs (None: it is).

    A Zeus client runs Merak's and DeepSpeed's synchronous 1F1B (``TrainSchedule``), forwards
    and backwards only: the order of Perseus's ``1f1b`` schedule (one model chunk per rank).
    """
    spec = job.spec
    want = make_schedule("1f1b", spec.stages, spec.microbatches).orders
    got = job.schedule.orders
    same = len(got) == len(want) and all(
        [(op.kind, op.microbatch) for op in g] == [(op.kind, op.microbatch) for op in w]
        for g, w in zip(got, want, strict=True)
    )
    if same:
        return None
    return (
        f"its schedule ({spec.schedule}, {spec.virtual_stages} model chunk(s) per rank) is not "
        "the synchronous 1F1B a Zeus client runs (Merak, DeepSpeed's TrainSchedule): make the "
        "prototype with schedule 1f1b"
    )


class ZeusRuns:
    """The Zeus runs of one server (see the module docstring)."""

    def __init__(self, service: PerseusService, config: ZeusConfig) -> None:
        self.service = service
        self.config = config
        self._runs: dict[str, _Run] = {}

    # --- register_job ----------------------------------------------------------------------------

    def register_job(self, tenant: str | None, info: ZeusJobInfo) -> str:
        """A new run of the prototype ``info.job_metadata`` names; returns its job id.

        ``tenant``: the caller's (None: the admin's, who may name any tenant's prototype; the
        run belongs to the prototype's tenant).
        """
        if info.job_id:
            raise BadRequest("must be empty: the server gives the run its id", field="job_id")
        if info.pp_degree * info.dp_degree * info.tp_degree != info.world_size:
            raise BadRequest(
                f"must be pp_degree * dp_degree * tp_degree = "
                f"{info.pp_degree * info.dp_degree * info.tp_degree}, got {info.world_size}",
                field="world_size",
            )
        proto = self._prototype(tenant, info.job_metadata)
        self._check_prototype(proto, info)
        spec = replace(
            proto.spec,
            data_parallel=info.dp_degree,
            tensor_parallel=info.tp_degree,
            name=f"{proto.spec.name or proto.id} (Zeus run)"[:200],
        )
        self._forget_deleted()
        store = self.service.store
        with store.transaction():
            job_id = str(self.service.create_job(spec, proto.row.tenant)["id"])
            job = self.service.jobs.get(job_id)
            self._take_profile(job, proto)
            self._take_frontier(job, proto)
        self._runs[job_id] = _Run(job_id, proto.row.tenant, proto.id, info.world_size)
        log.info(
            "job %s: Zeus run of prototype %s (pp %d, dp %d, tp %d)",
            job_id,
            proto.id,
            info.pp_degree,
            info.dp_degree,
            info.tp_degree,
        )
        return job_id

    def _prototype(self, tenant: str | None, metadata: str | None) -> Job:
        """The prototype job ``metadata`` (or the server's default) names in ``tenant``."""
        ref = (metadata or "").strip() or self.config.default_prototype
        if not ref:
            raise BadRequest(
                "name this run's prototype: pass the name or id of a Perseus job of your "
                "tenant (its profile, 1F1B schedule and plan policy; the pipeline this run "
                "trains) as PipelineFrequencyOptimizer's job_metadata, or start the server "
                "with --zeus-default-prototype",
                field="job_metadata",
            )
        mine = [
            j
            for j in self.service.jobs
            if (tenant is None or j.row.tenant == tenant) and j.id not in self._runs
        ]
        by_id = [j for j in mine if j.id == ref]
        if by_id:
            return by_id[0]
        named = [j for j in mine if j.spec.name == ref]
        if len(named) > 1:
            raise Conflict(
                f"{len(named)} jobs are named {ref[:64]!r}; pass the prototype's id as "
                "job_metadata",
                field="job_metadata",
            )
        if not named:
            where = f" in tenant {tenant!r}" if tenant is not None else ""
            raise BadRequest(
                f"no job named {ref[:64]!r} (nor with that id){where} to take as this run's "
                f"prototype: create it (POST /jobs with name {ref[:64]!r}, its profile and "
                "frontier) or pass an existing job's name or id as job_metadata",
                field="job_metadata",
            )
        return named[0]

    def _check_prototype(self, proto: Job, info: ZeusJobInfo) -> None:
        """Refuse a prototype this run cannot take, saying what to do."""
        label = f"prototype {proto.spec.name or proto.id!r} (job {proto.id})"
        if info.pp_degree != proto.spec.stages:
            raise BadRequest(
                f"the {label} has {proto.spec.stages} pipeline stages, this run "
                f"pp_degree={info.pp_degree}: name a prototype with {info.pp_degree} stages",
                field="pp_degree",
            )
        problem = zeus_order_problem(proto)
        if problem is not None:
            raise BadRequest(f"the {label}: {problem}", field="job_metadata")
        if proto.profile.current is None:
            raise Conflict(
                f"the {label} has no profile: PUT /jobs/{proto.id}/profile, then POST "
                f"/jobs/{proto.id}/frontier",
                field="job_metadata",
            )
        solving = self.service.solver.is_active(proto.id)
        if proto.frontier.current is None and not solving:
            raise Conflict(
                f"the {label} has no frontier: POST /jobs/{proto.id}/frontier (its runs reuse it)",
                field="job_metadata",
            )

    def _take_profile(self, job: Job, proto: Job) -> None:
        """Give the run its prototype's profile (stored as its own first revision)."""
        profile = proto.profile.current
        assert profile is not None
        stored = self.service.store.profile(proto.id)
        csv_text = stored[0] if stored is not None else profile.to_csv()
        rev = self.service.store.put_profile(job.id, csv_text, f"zeus prototype {proto.id}")
        job.profile.set(profile, rev, f"zeus prototype {proto.id}")

    def _take_frontier(self, job: Job, proto: Job) -> bool:
        """Give the run its prototype's frontier and policy, and deploy them.

        Returns False when the prototype has no frontier (yet): nothing changes.
        """
        frontier, row = proto.frontier.current, proto.frontier.row
        if frontier is None or row.doc is None or job.frontier.current is frontier:
            return False
        now = time.time()
        mine = FrontierRow(
            SolveStatus.DONE,
            1.0,
            None,
            row.doc,
            job.profile.revision,
            now,
            now,
            0.0,
            row.partial,
        )
        self.service.store.put_frontier(job.id, mine)
        job.frontier.row = mine
        job.frontier.set(frontier)
        dep = job.deployment
        dep.policy, dep.overrides = proto.deployment.policy, {}
        self.service.deployer.decide(job, f"Zeus run of prototype {proto.id}", force=True)
        return True

    def _forget_deleted(self) -> None:
        for job_id in [j for j in self._runs if j not in self.service.jobs]:
            del self._runs[job_id]

    # --- the runs' calls -------------------------------------------------------------------------

    def _run(self, tenant: str | None, job_id: str) -> tuple[_Run, Job]:
        """The run ``job_id`` of ``tenant``.

        Another tenant's job answers as an unknown id does (404); a job of the caller's that is
        not a Zeus run (or one made before the server last started) is a 409 saying so.
        """
        job = self.service.jobs.find(job_id)
        if job is None or (tenant is not None and job.row.tenant != tenant):
            raise NotFound(f"no job with id {job_id[:64]!r}", field="job_id")
        run = self._runs.get(job_id)
        if run is None:
            raise Conflict(
                f"job {job_id} is not a Zeus run of this server (runs are made by POST "
                "/register_job, and are not kept across a restart): start the training again",
                field="job_id",
            )
        return run, job

    def _contact(self, job_id: str) -> None:
        """A call of the run: it is active, and idle only after no call for the idle time."""
        lifecycle = self.service.lifecycle
        lifecycle.connected(job_id)
        lifecycle.disconnected(job_id)

    def register_rank(
        self, tenant: str | None, job_id: str, info: ZeusRankInfo, hostname: str = ""
    ) -> None:
        """Register a rank of run ``job_id``; errors name Zeus's fields."""
        run, job = self._run(tenant, job_id)
        spec = job.spec
        for name, value, n in (
            ("rank", info.rank, run.world_size),
            ("pp_rank", info.pp_rank, spec.stages),
            ("dp_rank", info.dp_rank, spec.data_parallel),
            ("tp_rank", info.tp_rank, spec.tensor_parallel),
        ):
            if not 0 <= value < n:
                raise BadRequest(
                    f"must be between 0 and {n - 1} for this run, got {value}", field=name
                )
        if not info.available_frequencies:
            raise BadRequest("the GPU's clocks (MHz) are needed", field="available_frequencies")
        req = RankRegistration(
            job_id=job_id,
            global_rank=info.rank,
            pipeline_rank=info.pp_rank,
            data_rank=info.dp_rank,
            tensor_rank=info.tp_rank,
            supported_clocks_mhz=info.available_frequencies,
            hostname=hostname,
        )
        try:
            registered = self.service.registration.register(req)
        except ApiError as e:
            mapped = _ZEUS_FIELDS.get(e.field or "", e.field)
            raise type(e)(e.detail, field=mapped, **e.extra) from None
        run.ranks[info.rank] = info
        run.rank_ids[info.rank] = registered.rank_id
        if run.first_registered is None:
            run.first_registered = time.monotonic()
        if len(run.ranks) >= run.world_size:
            run.all_registered.set()
        self._contact(job_id)

    def report(self, tenant: str | None, job_id: str, rank: int) -> None:
        """``POST /result``: a rank's profiling result (kept as contact; Perseus measures its own)."""
        run, _ = self._run(tenant, job_id)
        if rank not in run.ranks:
            raise Conflict(
                f"rank {rank} has not registered with run {job_id}: POST "
                f"/register_rank/{job_id} first",
                field="rank",
            )
        run.results += 1
        self._contact(job_id)

    async def schedule(self, tenant: str | None, job_id: str, rank: int) -> list[list[Any]]:
        """Rank ``rank``'s schedule: ``[[instruction, MHz], ...]`` for one iteration, in order.

        Waits at most ``plan_wait`` for the run's ranks and plan (see the module docstring).
        """
        run, job = self._run(tenant, job_id)
        info = run.ranks.get(rank)
        if info is None:
            raise Conflict(
                f"rank {rank} has not registered with run {job_id}: POST "
                f"/register_rank/{job_id} first",
                field="rank",
            )
        self._contact(job_id)
        if run.served is None:
            await self._wait(run)
            run, job = self._run(tenant, job_id)  # (deleted meanwhile: 404)
            self._pin(run, job)
        self._contact(job_id)
        return self._rank_schedule(run, job, info)

    async def _wait(self, run: _Run) -> None:
        """Wait, at most ``plan_wait``, for every rank and the run's settled plan."""
        deadline = time.monotonic() + self.config.plan_wait
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.all_registered.wait(), max(0.0, deadline - time.monotonic()))
        while run.served is None and not self._ready(run):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(POLL_SECONDS, left))

    def _ready(self, run: _Run) -> bool:
        """Whether the run has the plan it falls under (adopting its prototype's new frontier)."""
        job = self.service.jobs.find(run.job_id)
        if job is None:
            return True  # deleted: the caller answers 404
        proto = self.service.jobs.find(run.prototype)
        newer = proto is not None and proto.frontier.current is not job.frontier.current
        if newer and (job.frontier.current is None or job.frontier.row.partial):
            assert proto is not None
            with self.service.store.transaction():  # the prototype's new (or whole) frontier
                self._take_frontier(job, proto)
        if job.deployment.plan is None:
            return False
        if self.service.power_budget.settings is None or run.first_registered is None:
            return True
        settle = self.service.limits.budget_recompute_seconds + POLL_SECONDS
        return time.monotonic() >= run.first_registered + settle

    def _pin(self, run: _Run, job: Job) -> None:
        """Pin what the run's ranks are served: its plan, or the max-clock plan, saying why."""
        if run.served is not None:
            return
        dep = job.deployment.plan
        if dep is None:
            proto = self.service.jobs.find(run.prototype)
            why = (
                "its prototype's frontier is still being computed"
                if proto is not None and self.service.solver.is_active(proto.id)
                else "its prototype has no frontier"
            )
            top = max(max(r.available_frequencies) for r in run.ranks.values())
            dep = Deployment(
                version=job.deployment.version + 1,
                kind=DeploymentKind.MAX_CLOCK,
                reason=f"Zeus run: no plan within {self.config.plan_wait:g} s ({why}); its "
                "ranks run at maximum clocks (a Zeus client fetches its schedule once)",
                max_clock=top,
                deployed_at=time.time(),
            )
            self.service.deployer.publish(job, dep, "Zeus schedule")
            log.warning("job %s: %s", job.id, dep.reason)
        else:
            deployer = self.service.deployer
            run.plans = [deployer.pipeline_plan(job, dep, p)[1] for p in range(len(dep.indices))]
        run.served = dep

    def _rank_schedule(self, run: _Run, job: Job, info: ZeusRankInfo) -> list[list[Any]]:
        dep = run.served
        assert dep is not None
        if dep.kind is not DeploymentKind.PLAN:
            top = max(info.available_frequencies)
            return [[op.kind, top] for op in job.schedule.orders[info.pp_rank]]
        steps = run.plans[min(info.dp_rank, len(run.plans) - 1)][info.pp_rank]
        return [[s.instruction, s.frequency_mhz] for s in steps]

    def runs(self) -> dict[str, dict[str, Any]]:
        """Every run this server knows: its prototype, ranks registered and plan served."""
        return {
            r.job_id: {
                "prototype": r.prototype,
                "world_size": r.world_size,
                "ranks_registered": len(r.ranks),
                "served_version": None if r.served is None else r.served.version,
            }
            for r in self._runs.values()
        }
