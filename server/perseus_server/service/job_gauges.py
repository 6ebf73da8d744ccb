"""The per-job and per-tenant gauges of ``/metrics`` an operator alerts on (``docs/operations.md``).

Each job's info (name, tenant: what alerts join on to route), world size, lifecycle, the power
budget and each job's share, the deployed slowdowns (bounded per job: its slowest
``SLOWDOWN_SERIES`` pipelines and its min and max), profile mismatches, and each tenant's jobs,
quotas and budget share. Read at every scrape, ``O(jobs x pipelines)``.
"""

from __future__ import annotations

from perseus_server.domain.states import DeploymentKind, JobActivity, JobState, SolveStatus
from perseus_server.metric_series import OTHER, Labels
from perseus_server.runtime.hub import PlanHub
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import Deployer
from perseus_server.service.lifecycle import Lifecycle
from perseus_server.service.power_budget import PowerBudget
from perseus_server.service.slow_links import slow_link_gauges
from perseus_server.service.state import JobTable
from perseus_server.service.stragglers import ProfileChecks
from perseus_server.service.tenants import Tenants

__all__ = [
    "CLOCK_CONTROL_NODES",
    "SLOWDOWN_SERIES",
    "JobGauges",
    "clock_control_gauge",
    "connected_gauge",
    "jobs_gauge",
    "registered_gauge",
]

#: Pipelines per job with their own ``perseus_deployed_slowdown_ratio`` series (the slowest).
SLOWDOWN_SERIES = 8
#: Nodes per job named in ``perseus_ranks_without_clock_control`` (the rest: ``other``).
CLOCK_CONTROL_NODES = 32


def jobs_gauge(jobs: JobTable) -> dict[Labels, float]:
    """``perseus_jobs``: the jobs per state."""
    counts: dict[Labels, float] = {}
    for job in jobs:
        key = (("state", str(job.state())),)
        counts[key] = counts.get(key, 0) + 1
    return counts or {(("state", str(JobState.CREATED)),): 0}


def connected_gauge(jobs: JobTable, hub: PlanHub) -> dict[Labels, float]:
    """``perseus_connected_ranks``: per job, the ranks with a plan stream open."""
    counts = hub.connected_counts()
    return {(("perseus_job", j),): float(counts.get(j, 0)) for j in jobs.ids()}


def registered_gauge(jobs: JobTable) -> dict[Labels, float]:
    """``perseus_registered_ranks``: per job with ranks, how many registered."""
    return {
        (("perseus_job", j.id),): float(len(j.ranks.by_global)) for j in jobs if j.ranks.by_global
    }


def clock_control_gauge(jobs: JobTable) -> dict[Labels, float]:
    """Per job with registered ranks and node: how many ranks have no clock control.

    The node is the ranks' host name; the count is of ranks that say their clock control
    is unavailable. The nodes that have any, at most ``CLOCK_CONTROL_NODES`` per job
    (the rest summed as ``other``); a job with none has one sample, ``node=""``, 0.
    """
    out: dict[Labels, float] = {}
    for j in jobs:
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


class JobGauges:
    """Implements :class:`perseus_server.metrics.JobGaugeSource` over the service's parts."""

    def __init__(
        self,
        ctx: ServiceContext,
        deployer: Deployer,
        lifecycle: Lifecycle,
        budget: PowerBudget,
        checks: ProfileChecks,
        tenants: Tenants,
    ) -> None:
        self.ctx = ctx
        self.tenants = tenants
        self.deployer = deployer
        self.lifecycle = lifecycle
        self.budget = budget
        self.checks = checks

    def world_sizes(self) -> dict[Labels, float]:
        """``perseus_job_world_size`` by job."""
        return {(("perseus_job", j.id),): float(j.spec.world_size) for j in self.ctx.jobs}

    def lifecycles(self) -> dict[Labels, float]:
        """``perseus_job_lifecycle``: 1 for each job's state, 0 for the others."""
        out: dict[Labels, float] = {}
        for job_id in self.ctx.jobs.ids():
            state = self.lifecycle.state(job_id)
            for s in JobActivity:
                out[(("perseus_job", job_id), ("state", str(s)))] = 1.0 if s is state else 0.0
        return out

    def budget_watts(self) -> dict[Labels, float]:
        """``perseus_power_budget_watts``; empty when no budget is set."""
        watts, _, _ = self.budget.gauges()
        return {} if watts is None else {(): watts}

    def budget_feasible(self) -> dict[Labels, float]:
        """``perseus_power_budget_feasible``: 1 when the budget is met, else 0.

        Empty when no budget is set.
        """
        watts, feasible, _ = self.budget.gauges()
        return {} if watts is None else {(): 1.0 if feasible else 0.0}

    def allocations(self) -> dict[Labels, float]:
        """``perseus_power_budget_allocation_watts``: each covered job's share (W)."""
        _, _, shares = self.budget.gauges()
        return {(("perseus_job", j),): float(s.watts) for j, s in shares.items()}

    def job_infos(self) -> dict[Labels, float]:
        """``perseus_job_info``: 1 per job, labelled with its name and tenant."""
        return {
            (("perseus_job", j.id), ("name", j.spec.name), ("tenant", j.row.tenant)): 1.0
            for j in self.ctx.jobs
        }

    def _slowdowns(self) -> dict[str, list[tuple[float, int]]]:
        """Per job with a deployed plan: (slowdown, pipeline) of every pipeline."""
        out: dict[str, list[tuple[float, int]]] = {}
        for job in self.ctx.jobs:
            dep = job.deployment.current
            if dep is None or dep.kind is not DeploymentKind.PLAN or job.frontier.current is None:
                continue
            base = float(job.frontier.current.times[0])
            rows = out[job.id] = []
            for p, i in enumerate(dep.indices):
                t = float(self.deployer.pipeline_frontier(job, dep, p).times[i])
                rows.append((t / base - 1 if base > 0 else 0.0, p))
        return out

    def slowdowns(self) -> dict[Labels, float]:
        """The slowest ``SLOWDOWN_SERIES`` pipelines of each job (ties: lowest index)."""
        out: dict[Labels, float] = {}
        for job_id, rows in self._slowdowns().items():
            for value, p in sorted(rows, key=lambda r: (-r[0], r[1]))[:SLOWDOWN_SERIES]:
                out[(("perseus_job", job_id), ("pipeline", str(p)))] = value
        return out

    def slowdown_ranges(self) -> dict[Labels, float]:
        """``perseus_job_deployed_slowdown_ratio``: each job's least and greatest slowdown."""
        out: dict[Labels, float] = {}
        for job_id, rows in self._slowdowns().items():
            if rows:
                out[(("perseus_job", job_id), ("stat", "min"))] = min(v for v, _ in rows)
                out[(("perseus_job", job_id), ("stat", "max"))] = max(v for v, _ in rows)
        return out

    def frontier_failures(self) -> dict[Labels, float]:
        """``perseus_job_frontier_failed``: 1 for a job whose latest solve failed, else 0.

        A cancelled solve (by request, or its job deleted) is not a failure.
        """
        return {
            (("perseus_job", j.id),): 1.0
            if j.frontier.row.status == SolveStatus.FAILED
            and "cancel" not in (j.frontier.row.error or "")
            else 0.0
            for j in self.ctx.jobs
        }

    def tenant_gauges(self, name: str) -> dict[Labels, float]:
        """The per-tenant gauge ``name`` (see :data:`perseus_server.metrics.TENANT_GAUGES`)."""
        out: dict[Labels, float] = {}
        shares = self.budget.tenant_shares()
        for tenant in self.tenants.ids():
            key: Labels = (("tenant", tenant),)
            row = self.tenants.get(tenant)
            if name == "perseus_tenant_info":
                out[key] = 1.0
            elif name in ("perseus_tenant_jobs", "perseus_tenant_gpus"):
                jobs, gpus = self.tenants.usage(tenant)
                out[key] = float(jobs if name == "perseus_tenant_jobs" else gpus)
            elif name == "perseus_tenant_quota_jobs":
                out[key] = float(self.tenants.max_jobs(row))
            elif name == "perseus_tenant_quota_gpus":
                if row.max_gpus is not None:
                    out[key] = float(row.max_gpus)
            elif shares is not None:
                share = shares.get(tenant)
                if name == "perseus_tenant_power_guaranteed_watts":
                    out[key] = row.guaranteed_watts
                elif share is not None:
                    out[key] = share.gauge(name)
        return out

    def slow_links(self) -> dict[Labels, float]:
        """``perseus_slow_link``: 1 per slow link."""
        return slow_link_gauges(self.ctx.jobs)

    def profile_mismatches(self) -> dict[Labels, float]:
        """``perseus_profile_mismatch``: 1 for a job whose profile does not describe it, else 0."""
        return {
            (("perseus_job", j.id),): 1.0 if self.checks.reason(j) is not None else 0.0
            for j in self.ctx.jobs
        }
