"""The power budget's read side: what ``GET /power-budget``, a job's status and the gauges show.

:class:`~perseus_server.service.power_budget.PowerBudget` keeps the settings and computes the
allocation; this reads them, as a base class, without changing anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from perseus.power import JobAllocation
from perseus_server.domain.errors import NotFound
from perseus_server.service.budget_terms import BudgetResult, BudgetSettings
from perseus_server.service.context import ServiceContext
from perseus_server.service.state import Job
from perseus_server.service.tenant_shares import TenantShare

__all__ = ["BudgetViews"]


class BudgetViews:
    """What the budget shows; the state is :class:`PowerBudget`'s (set in its constructor)."""

    ctx: ServiceContext
    settings: BudgetSettings | None
    result: BudgetResult | None
    shares: dict[str, JobAllocation]
    claims: dict[str, str]
    participates: Callable[[Job], bool]
    why_out: Callable[[Job], str]

    def covers(self, job: Job) -> bool:
        """Whether the budget covers ``job`` (:class:`PowerBudget` answers)."""
        raise NotImplementedError

    def tenant_shares(self) -> dict[str, TenantShare] | None:
        """Each drawing tenant's part of the budget (None: no budget set)."""
        if self.settings is None or self.result is None:
            return None
        return {t.tenant: t for t in self.result.tenants}

    def _tenant(self, job_id: str) -> str | None:
        return self.ctx.jobs.get(job_id).row.tenant if job_id in self.ctx.jobs else None

    def view(self, tenant: str | None = None) -> dict[str, Any]:
        """``GET /power-budget``; 404 when none is set.

        ``tenant``: only that tenant's jobs are listed (the totals stay the cluster's).
        """
        s, r = self.settings, self.result
        if s is None or r is None:
            raise NotFound("no power budget is set; PUT /power-budget first", field="power_budget")
        jobs = [
            {**sh.to_json(), "time": sh.time}
            for sh in r.shares
            if tenant is None or self._tenant(sh.name) == tenant
        ]
        left_out = [
            x for x in self.left_out() if tenant is None or self._tenant(x["job"]) == tenant
        ]
        return {
            "watts": s.watts,
            "policy": s.policy,
            "allocated_watts": math.fsum(sh.watts for sh in r.shares),
            "feasible": r.feasible,
            "lowest_power": r.lowest_power,
            "covers": None
            if s.jobs is None
            else [j for j in s.jobs if tenant is None or self._tenant(j) == tenant],
            "gap": 0.0 if r.feasible else None,
            "on_infeasible": s.on_infeasible,
            "over_by": 0.0 if r.feasible else max(0.0, r.lowest_power - s.watts),
            "left_out": left_out,
            "jobs": jobs,
            "tenants": [t.to_json() for t in r.tenants if tenant is None or t.tenant == tenant],
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
                out.append({"job": job.id, "why": self.why_out(job)})
        return out

    def gauges(self) -> tuple[float | None, bool, dict[str, JobAllocation]]:
        """The budget's watts (None: no budget), whether it is met, and the shares by job."""
        if self.settings is None or self.result is None:
            return None, True, {}
        return self.settings.watts, self.result.feasible, dict(self.shares)

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
            "claim": self.claims.get(job.id),
        }
