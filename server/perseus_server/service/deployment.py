"""Deployment: deciding what every pipeline runs, and publishing it as the job's next plan.

Publishing as the job's next plan version, and building each rank's
:class:`~perseus_common.wire.values.PlanUpdate`.

Plan versions: each job has one version counter. Every deployment (a plan per data-parallel
pipeline, a profiling frequency step, or the max-clock plan while the profile of an online
profiling run is being solved) takes the next version and is pushed to every open stream.
A rank whose job has no deployment yet receives nothing until there is one (it runs at its
default clocks meanwhile).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from perseus.errors import InfeasibleError
from perseus.frontier import Frontier
from perseus_common.wire.values import PlanStep, PlanUpdate, ProfilingTask
from perseus_server.decisions.planner import PlanDecision, PlanPolicy, decide, resolve_policy
from perseus_server.domain.errors import BadRequest, Conflict
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import DeploymentKind, ProfilingStatus, ReplanKind
from perseus_server.runtime.faults import fault_point
from perseus_server.service.context import ServiceContext
from perseus_server.service.persistence import persist_deployment
from perseus_server.service.state import Deployment, Job, RankPlans
from perseus_server.service.swing import DeployedFloors, DeployedPair, bounds_of, checked_search

__all__ = ["Deployer", "DeploymentBudget", "require_frontier"]

log = logging.getLogger("perseus.server")


def require_frontier(job: Job) -> Frontier:
    """The job's frontier; raises :class:`Conflict` when it has none yet."""
    if job.frontier.current is None:
        raise Conflict(
            "the job has no frontier yet; POST /jobs/{id}/frontier first", field="frontier"
        )
    return job.frontier.current


class DeploymentBudget(Protocol):
    """What the deployer asks of a budget over the server's jobs.

    The cluster power budget (:class:`~perseus_server.service.power_budget.PowerBudget`)
    implements it (a budget that covers no job leaves every job its own policy).
    """

    def policy_for(self, job: Job) -> PlanPolicy | None:
        """The plan policy the budget imposes on ``job`` (None: the job's own)."""
        ...

    def stragglers_changed(self, job: Job) -> bool:
        """``job``'s stragglers changed (the caller re-decides it).

        Returns whether the budget re-deployed it already.
        """
        ...

    def deployment_power(
        self, job: Job, dep: Deployment, frontiers: list[Frontier]
    ) -> dict[str, Any] | None:
        """The powers of a deployed plan for its view, or None: no power in the view.

        ``pipelines``: one dict per pipeline, merged into each; the rest goes into the view.
        """
        ...


B = TypeVar("B", bound=DeploymentBudget)


class Deployer(Generic[B]):
    """Decides, publishes and describes a job's deployed plans.

    ``budget`` builds the :class:`DeploymentBudget` the deployer asks, given the deployer
    itself: a budget re-decides the jobs whose share it changes (it calls :meth:`decide`), and
    the deployer asks the budget for each job's policy, so the one is built from the other,
    here, in that order; the budget is :attr:`budget` afterwards (nothing is assigned later).
    """

    def __init__(self, ctx: ServiceContext, budget: Callable[[Deployer[B]], B]) -> None:
        self.ctx = ctx
        # per job, the plan view's pipelines and what they were built from (``_pipelines``)
        self._views: dict[str, tuple[tuple[Any, ...], list[dict[str, Any]]]] = {}
        self.floors = DeployedFloors()
        self.budget: B = budget(self)

    # --- deciding --------------------------------------------------------------------------------

    def deploy(
        self, job_id: str, policy: PlanPolicy, pipelines: list[int] | None
    ) -> dict[str, Any]:
        """``PUT /jobs/{id}/plan``: set the default policy (or pin some pipelines) and push."""
        job = self.ctx.jobs.get(job_id)
        frontier = require_frontier(job)
        if job.profiling_is(ProfilingStatus.RUNNING):
            raise Conflict(
                "online profiling is running; abort it (DELETE /jobs/{id}/profiling) first",
                field="profiling",
            )
        if self.budget.policy_for(job) is not None:
            raise Conflict(
                "the cluster power budget sets this job's plan; DELETE /power-budget (or leave "
                "the job out of its jobs) first",
                field="power_budget",
            )
        try:
            index = resolve_policy(frontier, policy)
        except InfeasibleError as e:
            lowest = getattr(e, "lowest_power", None)
            extra = {"lowest_power": lowest} if policy.kind == "power_budget" else {}
            raise BadRequest(str(e), field=policy.kind, **extra) from None
        self._check_swing(job, frontier, index, policy)
        dep = job.deployment
        if pipelines is not None:
            n = job.spec.data_parallel
            if not pipelines or any(not (0 <= p < n) for p in pipelines):
                raise BadRequest(
                    f"pipelines must be a non-empty list of indices in 0..{n - 1}",
                    field="pipelines",
                )
            dep.overrides = {**dep.overrides, **{p: index for p in pipelines}}
        else:
            dep.policy, dep.overrides = policy, {}
        self.decide(job, "selected through PUT /plan", force=True)
        view = self.view(job)
        assert view is not None  # just deployed
        return view

    def _check_swing(self, job: Job, frontier: Frontier, index: int, policy: PlanPolicy) -> None:
        """Under swing bounds, search the pair before anything is stored (a 422 when none)."""
        bounds = bounds_of(policy)
        if bounds is None:
            return
        from perseus_server.service.plan_powers import job_problem

        problem = job_problem(job, frontier)
        if problem is None:
            raise BadRequest(
                "the job's profile no longer describes its frontier's plans: re-solve it first",
                field="max_swing",
            )
        checked_search(job, frontier, index, policy, bounds, problem)

    def decide(self, job: Job, cause: str, *, force: bool = False) -> bool:
        """Re-decide every pipeline's plan and push it when it changed (or when ``force``)."""
        frontier = job.frontier.current
        assert frontier is not None
        dep = job.deployment
        resolved = {
            p: (st.frontier, st.describe())
            for p, st in job.stragglers.slow_stages.items()
            if st.ready and st.frontier is not None
        }
        budget = self.budget.policy_for(job)  # a cluster budget's share replaces policy and pins
        overrides = dep.overrides if budget is None else {}
        args = (job.spec.data_parallel, job.stragglers.stragglers, overrides, resolved)
        try:
            decision: PlanDecision = decide(
                frontier, budget if budget is not None else dep.policy, *args
            )
        except InfeasibleError:
            dep.policy = PlanPolicy()
            decision = decide(frontier, dep.policy, *args)
        own = tuple(p for p, plan in enumerate(decision.plans) if plan.own)
        cur = dep.plan
        same = (
            cur is not None
            and list(cur.indices) == decision.indices()
            and cur.own == own
            and list(cur.reasons) == [p.reason for p in decision.plans]
        )
        if same and not force:
            return False
        self.publish(
            job,
            Deployment(
                version=dep.version + 1,
                kind=DeploymentKind.PLAN,
                reason=decision.reason,
                indices=tuple(decision.indices()),
                reasons=tuple(p.reason for p in decision.plans),
                deployed_at=time.time(),
                own=own,
            ),
            cause,
        )
        return True

    def replan(self, job: Job, why: str, kind: ReplanKind) -> None:
        """Re-decide after a straggler or slow-stage event; record it among the recent replans."""
        budgeted = self.budget.stragglers_changed(job)
        changed = self.decide(job, why) or budgeted
        if not changed:
            persist_deployment(self.ctx.store, job)
        self.ctx.metrics.replans.inc(perseus_job=job.id, reason=kind)
        replans = job.stragglers.replans
        replans.append(
            {"time": time.time(), "why": why, "version": job.deployment.version, "changed": changed}
        )
        del replans[:-20]
        log.info("job %s: replan (%s): %s", job.id, kind, why)

    # --- publishing ------------------------------------------------------------------------------

    def publish(self, job: Job, dep: Deployment, cause: str) -> None:
        """Make ``dep`` the job's deployment (stored first), then push it to every stream."""
        state = job.deployment
        state.version = dep.version
        state.current = dep
        state.messages.clear()
        store = self.ctx.store
        with store.transaction():
            persist_deployment(store, job)
            fault_point("after_deployment_store")
        self.ctx.metrics.deploys.inc(perseus_job=job.id, kind=dep.kind)
        log.info("job %s: plan version %d (%s): %s", job.id, dep.version, cause, dep.reason)
        # Ranks hear of a version only once it is stored (inside a larger update: committed).
        store.after_commit(lambda: self.ctx.hub.publish(job.id, lambda r: self.message(job, r)))

    def message(self, job: Job, rank: RankInfo) -> PlanUpdate | None:
        """The newest plan for ``rank`` (cached per version, pipeline plan and stage)."""
        dep = job.deployment.current
        if dep is None:
            return None
        p = 0
        if dep.kind is DeploymentKind.PLAN:
            p = min(rank.data_rank, len(dep.indices) - 1)
            index = dep.indices[p]
            key: tuple[Any, ...] = (
                dep.version,
                index,
                dep.reasons[p],
                rank.pipeline_rank,
                p if p in dep.own else -1,
            )
        else:
            key = (dep.version, rank.pipeline_rank)
        cache = job.deployment.messages
        msg = cache.get(key)
        if msg is None:
            msg = self._build_message(job, dep, rank, p)
            cache[key] = msg
        return msg

    def _build_message(self, job: Job, dep: Deployment, rank: RankInfo, p: int) -> PlanUpdate:
        if dep.kind is DeploymentKind.PLAN:
            frontier, plans = self.pipeline_plan(job, dep, p)
            pair = self.pair(job, dep, p)
            return PlanUpdate(
                version=dep.version,
                reason=dep.reasons[p],
                expected_iteration_time=(
                    float(frontier.times[dep.indices[p]]) if pair is None else pair.time
                ),
                steps=plans[rank.pipeline_rank],
                power_floors=() if pair is None else tuple(pair.floors[rank.pipeline_rank]),
                plan_swing=0.0 if pair is None else pair.plan_swing,
                ramp_w_per_s=0.0 if pair is None else pair.ramp_w_per_s,
            )
        prof = dep.profiling or {}
        freq = prof.get("frequency", dep.max_clock)
        return PlanUpdate(
            version=dep.version,
            reason=dep.reason,
            steps=tuple(
                PlanStep(op.kind, op.microbatch, freq, op.stage)
                for op in job.schedule.orders[rank.pipeline_rank]
            ),
            profiling=ProfilingTask(freq, prof["warmup_iterations"], prof["iterations"])
            if dep.kind is DeploymentKind.PROFILING
            else None,
        )

    def pair(self, job: Job, dep: Deployment, p: int) -> DeployedPair | None:
        """Pipeline ``p``'s plan and floors under the job's swing bounds (None: no bounds).

        The policy's own point is searched within the policy's deadline; a pipeline on a
        re-solved frontier of its own (slow stages) within its point's time.
        """
        policy = job.deployment.policy
        bounds = bounds_of(policy)
        if bounds is None or dep.kind is not DeploymentKind.PLAN:
            return None
        frontier = self.pipeline_frontier(job, dep, p)
        if p in dep.own:
            policy = PlanPolicy("index", float(dep.indices[p]), swing=policy.swing)
        return self.floors.pair(job, frontier, dep.indices[p], policy, bounds)

    def _swing_view(self, job: Job, dep: Deployment, frontier: Frontier) -> dict[str, Any]:
        """The view's ``power_timeline`` and, under swing bounds, ``swing`` (pipeline 0's)."""
        out: dict[str, Any] = {}
        policy = (
            job.deployment.policy
            if 0 not in dep.own
            else PlanPolicy("index", float(dep.indices[0]), swing=job.deployment.policy.swing)
        )
        timeline = self.floors.timeline(job, frontier, dep.indices[0], policy)
        if timeline is not None:
            out["power_timeline"] = timeline
        pair = self.pair(job, dep, 0)
        bounds = bounds_of(policy)
        if bounds is not None and pair is not None:
            out["swing"] = {
                "bounds": bounds.to_json(),
                "plan_swing": pair.plan_swing,
                "power_floors": [[list(f) for f in r] for r in pair.floors],
                "ramp_w_per_s": pair.ramp_w_per_s,
                "time": pair.time,
                "searched": pair.searched,
                "plan_is_frontier_point": pair.steps is None,
                "ranks_without_floor": _unheld(job),
            }
        return out

    # --- pipelines -------------------------------------------------------------------------------

    def pipeline_frontier(self, job: Job, dep: Deployment, p: int) -> Frontier:
        """The frontier pipeline ``p``'s index in ``dep`` refers to."""
        if p in dep.own:
            st = job.stragglers.slow_stages.get(p)
            if st is not None and st.frontier is not None:
                return st.frontier
        assert job.frontier.current is not None
        return job.frontier.current

    def pipeline_plan(self, job: Job, dep: Deployment, p: int) -> tuple[Frontier, RankPlans]:
        """Pipeline ``p``'s frontier and per-rank plans under ``dep``.

        Under swing bounds, the searched plan's steps (:meth:`pair`).
        """
        pair = self.pair(job, dep, p) if dep.kind is DeploymentKind.PLAN else None
        if pair is not None and pair.steps is not None:
            return self.pipeline_frontier(job, dep, p), pair.steps
        if p in dep.own:
            st = job.stragglers.slow_stages.get(p)
            if st is not None and st.frontier is not None:
                index = dep.indices[p]
                plans = st.plans.get(index)
                if plans is None:
                    plans = st.plans[index] = st.frontier.plan(index)
                return st.frontier, plans
        assert job.frontier.current is not None
        return job.frontier.current, job.frontier.plan(dep.indices[p])

    # --- views -----------------------------------------------------------------------------------

    def _pipelines(
        self, job: Job, dep: Deployment, frontiers: list[Frontier], per: list[Any] | None
    ) -> list[dict[str, Any]]:
        """The view's ``pipelines``: each one's point, with its powers ``per``.

        The powers are there when the budget gives them. Kept per job while the deployment,
        the frontiers and ``per`` (the powers' cache keeps the same list while they hold)
        are the same objects: at 512 pipelines it was half of a status request; every call
        gets new dicts.
        """
        key = (dep, per, *frontiers)
        hit = self._views.get(job.id)
        if (
            hit is None
            or len(hit[0]) != len(key)
            or any(a is not b for a, b in zip(hit[0], key, strict=True))
        ):
            pipelines = []
            for p, (f, i) in enumerate(zip(frontiers, dep.indices, strict=True)):
                doc = {
                    "pipeline": p,
                    "index": i,
                    "frontier": "re-solved for its slow stage(s)" if p in dep.own else "job",
                    "time": float(f.times[i]),
                    "energy": float(f.energies[i]),
                    "reason": dep.reasons[p],
                }
                if per is not None:
                    doc.update(per[p])
                pipelines.append(doc)
            if len(self._views) > 4 * len(self.ctx.jobs) + 16:  # jobs deleted meanwhile
                self._views = {k: v for k, v in self._views.items() if k in self.ctx.jobs}
            hit = self._views[job.id] = (key, pipelines)
        return [dict(doc) for doc in hit[1]]

    def view(self, job: Job) -> dict[str, Any] | None:
        """What is deployed, as ``GET /jobs/{id}/status`` ``plan`` shows it (None: nothing)."""
        dep = job.deployment.current
        if dep is None:
            return None
        out: dict[str, Any] = {
            "version": dep.version,
            "kind": dep.kind,
            "reason": dep.reason,
            "deployed_at": dep.deployed_at,
            "policy": job.deployment.policy.to_json(),
        }
        if dep.kind is DeploymentKind.PLAN and job.frontier.current is not None:
            frontiers = [self.pipeline_frontier(job, dep, p) for p in range(len(dep.indices))]
            power = self.budget.deployment_power(job, dep, frontiers)
            per = None if power is None else power.pop("pipelines")
            out["pipelines"] = self._pipelines(job, dep, frontiers, per)
            if job.frontier.row.partial:
                out["partial"] = True
            if power is not None:
                out.update(power)
            out.update(self._swing_view(job, dep, frontiers[0]))
        elif dep.kind is DeploymentKind.PROFILING:
            out["profiling"] = dep.profiling
        else:
            out["frequency"] = dep.max_clock
        return out


def _unheld(job: Job) -> list[dict[str, Any]]:
    """The ranks whose GPU said it cannot hold a floor: global rank, why, the plan's swing."""
    out = []
    for rank_id, (state, reason, swing) in job.ranks.power_floor.items():
        rank = job.ranks.by_id.get(rank_id)
        if state == "unavailable" and rank is not None:
            out.append({"rank": rank.global_rank, "reason": reason, "plan_swing": swing})
    return sorted(out, key=lambda d: d["rank"])
