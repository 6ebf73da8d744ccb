"""One power budget over the server's jobs (``PUT /power-budget``, ``docs/power.md``).

The budget covers every job with a frontier (jobs created later included) or exactly the jobs
it lists. Each covered job becomes a :class:`perseus.power.PowerJob` (its frontier points; a
job whose pipelines wait for a straggler at ``T'`` gets ``min_time=T'``, so the power its waiting
frees goes to the others), :func:`perseus.power.allocate_power` shares the watts exactly, and
each job's share replaces its own policy as the plan the :class:`Deployer` decides from (its
stragglers still slow the other pipelines to them). The allocation is recomputed and pushed
when the budget changes, when a job is added (its first frontier), re-solved or deleted, and
when its stragglers change; the budget is stored, so a restart recomputes the same allocation.

Only *active* jobs share the budget (``service/lifecycle.py``): a job that goes idle or is
finished leaves it and the rest is shared again at once; one that comes back rejoins it.

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
from dataclasses import dataclass
from typing import Any, Protocol

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
from perseus_server.service.context import ServiceContext
from perseus_server.service.power import PlanPowers
from perseus_server.service.state import Deployment, Job

__all__ = ["ON_INFEASIBLE", "BudgetSettings", "BudgetShare", "PowerBudget", "straggler_time"]

#: What a budget that can no longer be met does (``PUT /power-budget`` ``on_infeasible``).
ON_INFEASIBLE = ("least_power", "keep_current")

log = logging.getLogger("perseus.server")


@dataclass(frozen=True)
class BudgetSettings:
    """What ``PUT /power-budget`` set: watts, policy, and the jobs (``None``: every job)."""

    watts: float
    policy: str = "throughput"
    jobs: tuple[str, ...] | None = None
    on_infeasible: str = "least_power"

    def to_json(self) -> dict[str, Any]:
        return {
            "watts": self.watts,
            "policy": self.policy,
            "jobs": None if self.jobs is None else list(self.jobs),
            "on_infeasible": self.on_infeasible,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BudgetSettings:
        jobs = doc.get("jobs")
        return cls(
            float(doc["watts"]),
            str(doc["policy"]),
            None if jobs is None else tuple(jobs),
            str(doc.get("on_infeasible", "least_power")),
        )


@dataclass(frozen=True)
class BudgetShare(PlanPolicy):
    """A job's share of the cluster budget, as the plan policy it runs (frontier point
    ``value``); its description names the budget."""

    budget: float = 0.0
    rule: str = "throughput"
    watts: float = 0.0
    feasible: bool = True
    on_infeasible: str = "least_power"

    def describe(self) -> str:
        base = (
            f"cluster power budget {self.budget:g} W ({self.rule}): {self.watts:.6g} W for this "
            f"job, frontier point {int(self.value)}"
        )
        if self.feasible:
            return base
        return base + f" (the budget is unreachable: {self.on_infeasible.replace('_', ' ')})"


def straggler_time(job: Job) -> float | None:
    """The slowest straggler's iteration time ``T'`` (s, on the profile's axis), a re-solved
    slow-stage pipeline's fastest time included; ``None`` without stragglers."""
    times = [s.time for s in job.stragglers.stragglers.values()]
    times += [
        float(st.frontier.times[0])
        for st in job.stragglers.slow_stages.values()
        if st.ready and st.frontier is not None
    ]
    return max(times) if times else None


def _least_power_shares(jobs: list[PowerJob]) -> tuple[JobAllocation, ...]:
    out = []
    for j in jobs:
        k = int(j.powers.argmin())
        out.append(
            JobAllocation(
                j.name,
                int(j.indices[k]),
                float(j.powers[k]),
                float(j.times[k]),
                float(j.slowdowns[k]),
                j.gpus,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class _Result:
    """An allocation (or, when infeasible, every job at its least power) and the lowest
    achievable power of the covered jobs (W)."""

    shares: tuple[JobAllocation, ...]
    feasible: bool
    lowest_power: float
    objective: float


class JobDecider(Protocol):
    """What the budget calls to re-deploy a job whose share changed (the
    :class:`~perseus_server.service.deployment.Deployer`)."""

    def decide(self, job: Job, cause: str, *, force: bool = False) -> bool: ...


class PowerBudget:
    """The cluster power budget: its settings, its allocation, and the
    :class:`~perseus_server.service.deployment.DeploymentBudget` the deployer asks (built by
    the deployer, given it as ``deployer``)."""

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: JobDecider,
        powers: PlanPowers,
        participates: Callable[[Job], bool] = lambda job: True,
    ) -> None:
        """``participates``: whether a job takes part in the budget (the service: active jobs
        only, see :mod:`perseus_server.service.lifecycle`)."""
        self.ctx = ctx
        self.deployer = deployer
        self.powers = powers
        self.settings: BudgetSettings | None = None
        self.result: _Result | None = None
        self.shares: dict[str, JobAllocation] = {}
        self._inputs: dict[str, tuple[int, float | None]] = {}  # per job: (frontier, T')
        self._busy = False
        self.participates = participates
        #: The shares of the last feasible allocation (what ``keep_current`` keeps).
        self._last_feasible: dict[str, tuple[JobAllocation, int]] = {}

    # --- which jobs, and what they can do ----------------------------------------------------

    def covers(self, job: Job) -> bool:
        s = self.settings
        return (
            s is not None
            and job.frontier.current is not None
            and not job.profiling_is(ProfilingStatus.RUNNING, ProfilingStatus.SOLVING)
            and (s.jobs is None or job.id in s.jobs)
            and self.participates(job)
        )

    def _input(self, job: Job) -> tuple[int, float | None]:
        return (id(job.frontier.current), straggler_time(job))

    def _power_job(self, job: Job) -> PowerJob:
        f = job.frontier.current
        assert f is not None
        return PowerJob.from_frontier(
            job.id,
            f,
            pipelines=job.spec.data_parallel,
            tensor_parallel=job.spec.tensor_parallel,
            min_time=straggler_time(job),
        )

    def _compute(self, settings: BudgetSettings, jobs: list[Job]) -> _Result:
        pjobs = [self._power_job(j) for j in jobs]
        if not pjobs:
            return _Result((), True, 0.0, 0.0)
        lowest = math.fsum(j.lowest_power for j in pjobs)
        try:
            alloc: Allocation = allocate_power(pjobs, settings.watts, policy=settings.policy)
        except PowerBudgetError:
            shares = _least_power_shares(pjobs)
            if settings.on_infeasible == "keep_current":
                shares = tuple(self._kept(j, sh) for j, sh in zip(jobs, shares, strict=True))
            return _Result(shares, False, lowest, math.nan)
        return _Result(alloc.jobs, True, lowest, alloc.objective)

    def _kept(self, job: Job, least: JobAllocation) -> JobAllocation:
        """``keep_current``: the job's share of the last feasible allocation, if it was made
        for the frontier the job has now (else its least-power share)."""
        kept = self._last_feasible.get(job.id)
        if kept is None or kept[1] != id(job.frontier.current):
            return least
        return kept[0]

    # --- what the deployer asks (DeploymentBudget) ------------------------------------------

    def policy_for(self, job: Job) -> PlanPolicy | None:
        """The plan policy the budget imposes on ``job`` (None: the job's own). A job the last
        allocation did not see as it is now (a new or re-solved frontier, other stragglers)
        has the allocation recomputed first (the other jobs are re-deployed by it)."""
        if not self.covers(job):
            return None
        if not self._busy and self._inputs.get(job.id) != self._input(job):
            self.recompute(f"job {job.id} changed", skip=job.id)
        return self._share_policy(job)

    def _share_policy(self, job: Job) -> BudgetShare | None:
        share = self.shares.get(job.id) if self.covers(job) else None
        if share is None or self.settings is None or self.result is None:
            return None
        s = self.settings
        return BudgetShare("index", float(share.index), 1, s.watts, s.policy, share.watts,
                           self.result.feasible, s.on_infeasible)  # fmt: skip

    def stragglers_changed(self, job: Job) -> bool:
        """A job's stragglers changed: recompute, re-deploying the other jobs (the job itself
        is re-decided by the caller); returns False (the job was not re-deployed here)."""
        if self.covers(job) and not self._busy:
            self.recompute(f"job {job.id}'s stragglers changed", skip=job.id)
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

    def recompute(self, cause: str, *, skip: str | None = None) -> None:
        """Allocate again over the covered jobs and push every changed plan (``skip``: a job
        its caller re-decides itself)."""
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
        """After a restart: the stored budget, its allocation recomputed (unchanged plans are
        not pushed again)."""
        doc = self.ctx.store.power_budget()
        if doc is not None:
            self.settings = BudgetSettings.from_json(doc)
            self.recompute("server restarted")

    def job_removed(self, job_id: str) -> None:
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
        self.recompute(f"job {job_id} deleted")

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
        if not trial.feasible:
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

    def view(self) -> dict[str, Any]:
        """``GET /power-budget``; 404 when none is set."""
        s, r = self.settings, self.result
        if s is None or r is None:
            raise NotFound("no power budget is set; PUT /power-budget first", field="power_budget")
        jobs = [{**sh.to_json(), "time": sh.time} for sh in r.shares]
        return {
            "watts": s.watts,
            "policy": s.policy,
            "allocated_watts": math.fsum(sh.watts for sh in r.shares),
            "feasible": r.feasible,
            "lowest_power": r.lowest_power,
            "covers": None if s.jobs is None else list(s.jobs),
            "gap": 0.0 if r.feasible else None,
            "on_infeasible": s.on_infeasible,
            "over_by": 0.0 if r.feasible else max(0.0, r.lowest_power - s.watts),
            "left_out": self.left_out(),
            "jobs": jobs,
        }

    def left_out(self) -> list[dict[str, str]]:
        """The jobs the budget would cover but for their lifecycle (idle or finished)."""
        s = self.settings
        if s is None:
            return []
        out = []
        for job in self.ctx.jobs:
            if (
                job.frontier.current is not None
                and (s.jobs is None or job.id in s.jobs)
                and not self.participates(job)
            ):
                out.append({"job": job.id, "why": "not active (idle or finished)"})
        return out

    def gauges(self) -> tuple[float | None, bool, dict[str, JobAllocation]]:
        """The budget's watts (None: no budget), whether it is met, and the shares by job."""
        if self.settings is None or self.result is None:
            return None, True, {}
        return self.settings.watts, self.result.feasible, dict(self.shares)

    def delete(self) -> None:
        """``DELETE /power-budget``: every job back to its own policy."""
        if self.settings is None:
            raise NotFound("no power budget is set", field="power_budget")
        self.ctx.store.put_power_budget(None)
        self.settings = None
        self.recompute("budget removed")

    def job_share(self, job: Job) -> dict[str, Any] | None:
        """The job's share for its status (None: the budget does not cover it)."""
        share = self.shares.get(job.id) if self.covers(job) else None
        if share is None or self.settings is None or self.result is None:
            return None
        return {
            "budget": self.settings.watts,
            "policy": self.settings.policy,
            "watts": share.watts,
            "slowdown": share.slowdown,
            "point": share.index,
            "feasible": self.result.feasible,
            "on_infeasible": self.settings.on_infeasible,
        }
