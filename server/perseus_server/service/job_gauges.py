"""The per-job gauges of ``/metrics`` an operator alerts on (``docs/operations.md``): world
size, lifecycle, the power budget and each job's share, each pipeline's deployed slowdown, and
profile mismatches. Read at every scrape, ``O(jobs x pipelines)``."""

from __future__ import annotations

from perseus_server.domain.states import DeploymentKind, JobActivity
from perseus_server.metrics import Labels
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.lifecycle import Lifecycle
from perseus_server.service.power_budget import PowerBudget
from perseus_server.service.slow_links import slow_link_gauges
from perseus_server.service.stragglers import ProfileChecks

__all__ = ["JobGauges"]


class JobGauges:
    """Implements :class:`perseus_server.metrics.JobGaugeSource` over the service's parts."""

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: Deployer,
        lifecycle: Lifecycle,
        budget: PowerBudget,
        checks: ProfileChecks,
    ) -> None:
        self.ctx = ctx
        self.deployer = deployer
        self.lifecycle = lifecycle
        self.budget = budget
        self.checks = checks

    def world_sizes(self) -> dict[Labels, float]:
        return {(("job", j.id),): float(j.spec.world_size) for j in self.ctx.jobs}

    def lifecycles(self) -> dict[Labels, float]:
        out: dict[Labels, float] = {}
        for job_id in self.ctx.jobs.ids():
            state = self.lifecycle.state(job_id)
            for s in JobActivity:
                out[(("job", job_id), ("state", str(s)))] = 1.0 if s is state else 0.0
        return out

    def budget_watts(self) -> dict[Labels, float]:
        watts, _, _ = self.budget.gauges()
        return {} if watts is None else {(): watts}

    def budget_feasible(self) -> dict[Labels, float]:
        watts, feasible, _ = self.budget.gauges()
        return {} if watts is None else {(): 1.0 if feasible else 0.0}

    def allocations(self) -> dict[Labels, float]:
        _, _, shares = self.budget.gauges()
        return {(("job", j),): float(s.watts) for j, s in shares.items()}

    def slowdowns(self) -> dict[Labels, float]:
        out: dict[Labels, float] = {}
        for job in self.ctx.jobs:
            dep = job.deployment.current
            if dep is None or dep.kind is not DeploymentKind.PLAN or job.frontier.current is None:
                continue
            base = float(job.frontier.current.times[0])
            for p, i in enumerate(dep.indices):
                t = float(self.deployer.pipeline_frontier(job, dep, p).times[i])
                out[(("job", job.id), ("pipeline", str(p)))] = t / base - 1 if base > 0 else 0.0
        return out

    def slow_links(self) -> dict[Labels, float]:
        return slow_link_gauges(self.ctx.jobs)

    def profile_mismatches(self) -> dict[Labels, float]:
        return {
            (("job", j.id),): 1.0 if self.checks.reason(j) is not None else 0.0
            for j in self.ctx.jobs
        }
