"""One power budget over the server's jobs (``PUT /power-budget``, ``docs/power.md``).

The budget covers every job with a frontier (jobs created later included) or exactly the jobs
it lists. Each covered job becomes a :class:`perseus.power.PowerJob` (its frontier points; a
job whose pipelines wait for a straggler at ``T'`` gets ``min_time=T'``, so the power its waiting
frees goes to the others), :func:`perseus.power.allocate_power` shares the watts exactly, and
each job's share replaces its own policy as the plan the :class:`Deployer` decides from (its
stragglers still slow the other pipelines to them). The allocation is recomputed and pushed
when the budget changes, when a job is added (its first frontier), re-solved or deleted, and
when its stragglers change; the budget is stored, so a restart recomputes the same allocation.

Only jobs that *draw* share the budget: active (``service/lifecycle.py``), and only for their
pipelines whose every rank is connected (:mod:`perseus_server.service.budget_draw`), never from
their creation alone. A job that goes idle or is finished leaves it and the rest is shared
again; one whose first pipeline completes, or that comes back, joins it.

**Merged.** Every change a job makes is merged: its ranks and lifecycle, its stragglers marked
or cleared, a new frontier (a re-solve), its deletion. The first recomputes at once; more within
``Limits.budget_recompute_seconds`` of it wait and are recomputed once at the end of that
interval (:meth:`PowerBudget.request_recompute`), so no job, whatever its tenant does, can
redeploy the other jobs' plans at its pace. Until then a job whose frontier changed runs its
new frontier's fastest plan within its last share (:meth:`PowerBudget._interim`). The admin's
changes (the budget, a tenant's terms) recompute at once.

**Claims are bounded.** A job's power at each frontier point comes from its profile and
``blocking_power``; what it can draw is bounded by its GPUs: those of its counted pipelines
(``pipelines x stages x tensor_parallel``) times one GPU's maximum power limit (its ranks' registered limits, else the known-GPU table for their GPU or
the job's ``gpu_model``, else ``Limits.max_gpu_watts``). A point above it counts as that bound,
and the job's share says so (``claim``), so an absurd claim (``blocking_power`` 10 kW) takes no
more of the budget than the GPUs could draw.

**Tenants.** The budget is first shared between the tenants whose jobs draw on it (guaranteed
watts, then by weight: :mod:`perseus_server.service.tenant_shares`), then within each tenant by
the budget's policy. With one tenant drawing (a single-tenant deployment), the policy shares
the whole budget among its jobs, as before tenants existed.

A budget below what the covered jobs can reach is refused when it is set (422 naming the lowest
achievable power, nothing changed). One that becomes unreachable later (a job joins) is kept and
reported ``feasible: false`` (in ``GET /power-budget``, each job's status, the metric
``perseus_power_budget_feasible`` and the operator page, with a warning logged once), and its
``on_infeasible`` policy says what runs then: ``least_power`` (the default) moves every covered
job to its least-power plan; ``keep_current`` keeps the plans the jobs ran under the last
feasible allocation (a job without one runs its least-power plan), so a job that joins never
slows the running ones down.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from perseus.frontier import Frontier
from perseus.power import (
    SPLIT_RULES,
    Allocation,
    JobAllocation,
    PowerBudgetError,
    PowerJob,
    allocate_power,
)
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.errors import BadRequest, NotFound
from perseus_server.domain.states import ProfilingStatus
from perseus_server.service.budget_draw import counted_pipelines
from perseus_server.service.budget_pacing import Pacer
from perseus_server.service.budget_terms import (
    ON_INFEASIBLE,
    BudgetResult,
    BudgetSettings,
    BudgetShare,
    JobDecider,
    least_power_shares,
    straggler_time,
)
from perseus_server.service.budget_views import BudgetViews
from perseus_server.service.context import ServiceContext
from perseus_server.service.plan_powers import PlanPowers
from perseus_server.service.plans import job_max_power
from perseus_server.service.state import Deployment, Job
from perseus_server.service.tenant_shares import TenantDemand, TenantShare, split
from perseus_server.service.tenants import Tenants

__all__ = ["PowerBudget"]

log = logging.getLogger("perseus.server")


class PowerBudget(BudgetViews):
    """The cluster power budget: its settings, its allocation, and the deployer's view of it.

    The deployer asks it as a :class:`~perseus_server.service.deployment.DeploymentBudget`
    (built by the deployer, given it as ``deployer``).
    """

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: JobDecider,
        powers: PlanPowers,
        participates: Callable[[Job], bool] = lambda job: True,
        tenants: Tenants | None = None,
        why_out: Callable[[Job], str] = lambda job: "not drawing",
    ) -> None:
        """Set up the budget over the jobs that take part.

        ``participates``: whether a job takes part in the budget (the service: active jobs
        with a connected rank, see :mod:`perseus_server.service.lifecycle`); ``tenants``:
        their weights and guarantees (None: every job shares alike).
        """
        self.ctx = ctx
        self.tenants = tenants
        self.why_out = why_out
        #: Per job whose claim was bounded by its GPUs: why (shown in its share).
        self.claims: dict[str, str] = {}
        self._pacer = Pacer(
            lambda: ctx.limits.budget_recompute_seconds,
            lambda cause, skip: self.recompute(cause, skip=skip),
        )
        self.deployer = deployer
        self.powers = powers
        self.settings: BudgetSettings | None = None
        self.result: BudgetResult | None = None
        self.shares: dict[str, JobAllocation] = {}
        self._inputs: dict[str, tuple[int, float | None, int]] = {}  # (frontier, T', pipelines)
        self._busy = False
        self.participates = participates
        #: The shares of the last feasible allocation (what ``keep_current`` keeps).
        self._last_feasible: dict[str, tuple[JobAllocation, int]] = {}

    # --- which jobs, and what they can do ----------------------------------------------------

    def covers(self, job: Job) -> bool:
        """Whether the budget covers ``job`` now.

        It does while a budget is set and names the job (or every job), the job has a
        frontier and is not being profiled, and it takes part (:attr:`participates`).
        """
        s = self.settings
        return (
            s is not None
            and job.frontier.current is not None
            and not job.profiling_is(ProfilingStatus.RUNNING, ProfilingStatus.SOLVING)
            and (s.jobs is None or job.id in s.jobs)
            and self.participates(job)
        )

    def _input(self, job: Job) -> tuple[int, float | None, int]:
        return (id(job.frontier.current), straggler_time(job), counted_pipelines(job))

    def _power_job(self, job: Job) -> PowerJob:
        """The job's choices for its complete pipelines, bounded by what their GPUs can draw.

        Only pipelines whose every rank is connected count (:mod:`.budget_draw`).
        """
        f = job.frontier.current
        assert f is not None
        pipelines = max(1, counted_pipelines(job))  # a covered job has one at least
        pj = PowerJob.from_frontier(
            job.id,
            f,
            pipelines=pipelines,
            tensor_parallel=job.spec.tensor_parallel,
            min_time=straggler_time(job),
        )
        per_gpu, source = job_max_power(job) or (
            self.ctx.limits.max_gpu_watts,
            "the server's bound for a GPU it knows nothing of (max_gpu_watts)",
        )
        gpus = pipelines * job.spec.stages * job.spec.tensor_parallel
        bound = per_gpu * gpus
        if pj.max_power <= bound:
            self.claims.pop(job.id, None)
            return pj
        why = (
            f"its plans claim up to {pj.max_power:.6g} W, more than the {gpus} GPU(s) of its "
            f"{pipelines} counted pipeline(s) can draw ({per_gpu:.6g} W each, {source}): "
            f"counted as {bound:.6g} W"
        )
        if self.claims.get(job.id) != why:
            self.ctx.metrics.refusals.inc(tenant=job.row.tenant, reason="power_claim_clipped")
            log.warning("power budget: job %s: %s", job.id, why)
        self.claims[job.id] = why
        powers = np.minimum(pj.powers, bound)
        return PowerJob(pj.name, pj.gpus, pj.times, powers, pj.indices, pj.reference_time)

    def _terms(self, tenant: str) -> tuple[float, float]:
        """A tenant's (weight, guaranteed watts)."""
        if self.tenants is None or tenant not in self.tenants:
            return 1.0, 0.0
        row = self.tenants.get(tenant)
        return row.weight, row.guaranteed_watts

    def _compute(self, settings: BudgetSettings, jobs: list[Job]) -> BudgetResult:
        groups: dict[str, list[tuple[Job, PowerJob]]] = {}
        for j in jobs:
            groups.setdefault(j.row.tenant, []).append((j, self._power_job(j)))
        if not groups:
            return BudgetResult((), True, 0.0, 0.0)
        demands = [
            TenantDemand(
                t,
                *self._terms(t),
                math.fsum(pj.lowest_power for _, pj in g),
                math.fsum(pj.max_power for _, pj in g),
            )
            for t, g in groups.items()
        ]
        parts = (
            {demands[0].tenant: settings.watts}
            if len(demands) == 1
            else split(settings.watts, demands)
        )
        shares: list[JobAllocation] = []
        tenants: list[TenantShare] = []
        feasible, objective = True, 0.0
        for d in demands:
            got, ok, obj = self._allocate(settings, groups[d.tenant], parts[d.tenant], d.high)
            shares.extend(got)
            feasible, objective = feasible and ok, objective + obj
            allocated = math.fsum(sh.watts for sh in got)
            tenants.append(
                TenantShare(d.tenant, parts[d.tenant], allocated, d.high, d.guaranteed, ok)
            )
        lowest = math.fsum(d.low for d in demands)
        return BudgetResult(tuple(shares), feasible, lowest, objective, tuple(tenants))

    def _allocate(
        self, settings: BudgetSettings, group: list[tuple[Job, PowerJob]], watts: float, high: float
    ) -> tuple[tuple[JobAllocation, ...], bool, float]:
        """One tenant's jobs over its part (``watts``): (shares, feasible, objective)."""
        pjobs = [pj for _, pj in group]
        if watts >= high:  # every job's fastest plan fits: no rounding may refuse it
            watts = max(watts, high * (1 + 1e-9) + 1e-9)
        try:
            alloc: Allocation = allocate_power(pjobs, watts, policy=settings.policy)
        except PowerBudgetError:
            shares = least_power_shares(pjobs)
            if settings.on_infeasible == "keep_current":
                shares = tuple(self._kept(j, sh) for (j, _), sh in zip(group, shares, strict=True))
            return shares, False, math.nan
        return alloc.jobs, True, alloc.objective

    def _kept(self, job: Job, least: JobAllocation) -> JobAllocation:
        """``keep_current``: the job's share of the last feasible allocation, if still valid.

        It holds if it was made for the frontier the job has now (else its least-power
        share).
        """
        kept = self._last_feasible.get(job.id)
        if kept is None or kept[1] != id(job.frontier.current):
            return least
        return kept[0]

    # --- what the deployer asks (DeploymentBudget) ------------------------------------------

    def policy_for(self, job: Job) -> PlanPolicy | None:
        """The plan policy the budget imposes on ``job`` (None: the job's own).

        A job the last allocation did not see as it is now (a new or re-solved frontier,
        other stragglers, other complete pipelines) asks for a recomputation (merged, see
        *Merged*; the other jobs are re-deployed by it); until it runs, a new frontier's job
        runs :meth:`_interim`.
        """
        if not self.covers(job):
            return None
        if not self._busy and self._inputs.get(job.id) != self._input(job):
            self.request_recompute(f"job {job.id} changed", skip=job.id)
        return self._share_policy(job)

    def _share_policy(self, job: Job) -> BudgetShare | None:
        if self.settings is None or self.result is None or not self.covers(job):
            return None
        share = self.shares.get(job.id)
        if self._inputs.get(job.id, (None,))[0] != id(job.frontier.current):
            share = self._interim(job, share)  # a recomputation is pending: until then
        if share is None:
            return None
        s = self.settings
        return BudgetShare("index", float(share.index), 1, s.watts, s.policy, share.watts,
                           self.result.feasible, s.on_infeasible)  # fmt: skip

    def _interim(self, job: Job, old: JobAllocation | None) -> JobAllocation:
        """What a job whose frontier changed runs until the pending recomputation.

        Its new frontier's fastest point within the watts its last share had (a job new to
        the budget: its least-power point), so waiting for the merge never takes more.
        """
        pj = self._power_job(job)
        fits = np.flatnonzero(pj.powers <= (old.watts if old is not None else -math.inf))
        k = int(fits[np.argmin(pj.times[fits])]) if fits.size else int(pj.powers.argmin())
        return JobAllocation(job.id, int(pj.indices[k]), float(pj.powers[k]),
                             float(pj.times[k]), float(pj.slowdowns[k]), pj.gpus)  # fmt: skip

    def stragglers_changed(self, job: Job) -> bool:
        """A job's stragglers changed: recompute, re-deploying the other jobs; returns False.

        The job itself is re-decided by the caller; False says it was not re-deployed here.
        """
        if self.covers(job) and not self._busy:
            self.request_recompute(f"job {job.id}'s stragglers changed", skip=job.id)
        return False

    def deployment_power(
        self, job: Job, dep: Deployment, frontiers: list[Frontier]
    ) -> dict[str, Any]:
        """The deployment view's powers, and which constraint set the plan."""
        out = self.powers.deployment(job, dep, frontiers)
        budget = self._share_policy(job) is not None
        straggling = straggler_time(job) is not None
        out["constraint"] = (
            "power budget and straggler"
            if budget and straggling
            else "power budget"
            if budget
            else "straggler"
            if straggling
            else "own policy"
        )
        return out

    # --- recomputing -------------------------------------------------------------------------

    def request_recompute(self, cause: str, *, skip: str | None = None) -> None:
        """Recompute for a change a job made, merged (see the module docstring, *Merged*).

        ``skip``: a job its caller re-decides itself (when it runs at once).
        """
        if self.settings is not None:
            self._pacer.request(cause, skip)

    def recompute(self, cause: str, *, skip: str | None = None) -> None:
        """Allocate again over the covered jobs and push every changed plan.

        ``skip``: a job its caller re-decides itself. Every change merged so far is in it: a
        pending merged recomputation is dropped.
        """
        self._pacer.covered()
        self.ctx.metrics.budget_recomputations.inc()
        before = set(self.shares)
        was_feasible = self.result is None or self.result.feasible
        settings = self.settings
        jobs = [j for j in self.ctx.jobs if self.covers(j)]
        self._busy = True
        try:
            if settings is None:
                self.result, self.shares, self._inputs = None, {}, {}
            else:
                self.result = self._compute(settings, jobs)
                self.shares = {s.name: s for s in self.result.shares}
                self._inputs = {j.id: self._input(j) for j in jobs}
                if self.result.feasible:
                    self._last_feasible = {
                        j.id: (self.shares[j.id], id(j.frontier.current))
                        for j in jobs
                        if j.id in self.shares
                    }
            touched = before | set(self.shares)
            for job_id in sorted(touched):
                if job_id == skip or job_id not in self.ctx.jobs:
                    continue
                job = self.ctx.jobs.get(job_id)
                if job.frontier.current is None or job.profiling_is(
                    ProfilingStatus.RUNNING, ProfilingStatus.SOLVING
                ):
                    continue
                self.deployer.decide(job, f"power budget: {cause}")
        finally:
            self._busy = False
        if self.result is not None and not self.result.feasible and was_feasible:
            assert settings is not None
            log.warning(
                "power budget %g W cannot be met (%s): the %d covered job(s) need at least "
                "%.6g W; on_infeasible=%s",
                settings.watts,
                cause,
                len(self.shares),
                self.result.lowest_power,
                settings.on_infeasible,
            )
        if self.result is not None:
            log.info(
                "power budget %s W over %d job(s) (%s): %s",
                settings.watts if settings else None,
                len(self.shares),
                cause,
                "feasible" if self.result.feasible else "unreachable",
            )

    def load(self) -> None:
        """Load the stored budget after a restart, its allocation recomputed.

        Unchanged plans are not pushed again.
        """
        doc = self.ctx.store.power_budget()
        if doc is not None:
            self.settings = BudgetSettings.from_json(doc)
            self.recompute("server restarted")

    def job_removed(self, job_id: str) -> None:
        """A deleted job: drop it from the settings and the shares, and recompute."""
        s = self.settings
        if s is None:
            return
        if s.jobs is not None and job_id in s.jobs:
            self.settings = BudgetSettings(
                s.watts, s.policy, tuple(j for j in s.jobs if j != job_id), s.on_infeasible
            )
            self.ctx.store.put_power_budget(self.settings.to_json())
        self.shares.pop(job_id, None)
        self._inputs.pop(job_id, None)
        self.request_recompute(f"job {job_id} deleted")

    # --- the REST operations -----------------------------------------------------------------

    def put(
        self,
        watts: float,
        policy: str,
        jobs: list[str] | None,
        on_infeasible: str = "least_power",
    ) -> dict[str, Any]:
        """``PUT /power-budget``: checked in full first; a bad budget changes nothing."""
        if on_infeasible not in ON_INFEASIBLE:
            raise BadRequest(
                f"must be one of {', '.join(ON_INFEASIBLE)}, got {on_infeasible!r}",
                field="on_infeasible",
            )
        if not (isinstance(watts, int | float) and math.isfinite(watts) and watts > 0):
            raise BadRequest(f"must be a finite number of watts > 0, got {watts!r}", field="watts")
        if policy not in SPLIT_RULES:
            raise BadRequest(
                f"must be one of {', '.join(SPLIT_RULES)}, got {policy!r}", field="policy"
            )
        if jobs is not None:
            if len(set(jobs)) != len(jobs):
                raise BadRequest("the jobs must be distinct", field="jobs")
            for k, job_id in enumerate(jobs):
                if job_id not in self.ctx.jobs:
                    raise BadRequest(f"no job with id {job_id!r}", field=f"jobs.{k}")
                if self.ctx.jobs.get(job_id).frontier.current is None:
                    raise BadRequest(
                        f"job {job_id!r} has no frontier yet; POST /jobs/{{id}}/frontier first",
                        field=f"jobs.{k}",
                    )
        settings = BudgetSettings(
            float(watts), policy, None if jobs is None else tuple(jobs), on_infeasible
        )
        old = self.settings
        self.settings = settings  # for covers(); restored below if the budget is refused
        try:
            trial = self._compute(settings, [j for j in self.ctx.jobs if self.covers(j)])
        finally:
            self.settings = old
        same = old is not None and (old.watts, old.policy, old.jobs) == (
            settings.watts,
            settings.policy,
            settings.jobs,
        )
        if not trial.feasible and not same:  # changing only on_infeasible is always allowed
            raise BadRequest(
                f"no allocation fits {watts:.6g} W; the lowest achievable over the covered jobs "
                f"is {trial.lowest_power:.6g} W (every job at its slowest plan)",
                field="watts",
                lowest_power=trial.lowest_power,
            )
        self.ctx.store.put_power_budget(settings.to_json())
        self.settings = settings
        self.recompute(f"budget set to {watts:g} W ({policy})")
        return self.view()

    def delete(self) -> None:
        """``DELETE /power-budget``: every job back to its own policy."""
        if self.settings is None:
            raise NotFound("no power budget is set", field="power_budget")
        self.ctx.store.put_power_budget(None)
        self.settings = None
        self.recompute("budget removed")
