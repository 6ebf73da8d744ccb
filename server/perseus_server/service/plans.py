"""Plan queries: the frontier point a policy selects, as a JSON document (cached per point)."""

from __future__ import annotations

import json
from typing import Any

from perseus.errors import InfeasibleError
from perseus.power import PowerBudgetError
from perseus_server.domain.errors import BadRequest
from perseus_server.policy.planner import PlanPolicy, resolve_policy
from perseus_server.service.context import ServiceContext
from perseus_server.service.deployment import require_frontier
from perseus_server.service.power import PlanPowers
from perseus_server.service.state import Job

__all__ = ["PlanQueries", "plan_doc", "policy_error"]


def policy_error(e: InfeasibleError, policy: PlanPolicy) -> BadRequest:
    """The 422 of a policy no plan meets; a power budget's names the lowest achievable power."""
    if isinstance(e, PowerBudgetError):
        return BadRequest(str(e), field=policy.kind, lowest_power=e.lowest_power)
    return BadRequest(str(e), field=policy.kind)


def plan_doc(
    job: Job, index: int, *, steps: bool, powers: PlanPowers | None = None
) -> dict[str, Any]:
    """Frontier point ``index`` of ``job``: its time, energy, bound, savings and frequencies;
    ``partial`` when the job's frontier is only a first plan (the answer is from what exists)."""
    f = job.frontier.current
    assert f is not None
    plan = job.frontier.steps(index)
    doc: dict[str, Any] = {
        "index": index,
        "time": float(f.times[index]),
        "energy": float(f.energies[index]),
        "lower_bound": float(f.lower_bounds[index]),
        "max_frequency_time": f.max_frequency_time,
        "max_frequency_energy": f.max_frequency_energy,
        "slowdown": float(f.times[index]) / f.max_frequency_time - 1.0,
        "energy_savings": 1.0 - float(f.energies[index]) / f.max_frequency_energy,
        "frequencies": [[s["frequency"] for s in rank] for rank in plan],
    }
    if powers is not None:
        doc.update(powers.point(job, index))
    if job.frontier.row.partial:
        doc["partial"] = True
    if steps:
        doc["steps"] = plan
    return doc


class PlanQueries:
    """``GET /jobs/{id}/plan``."""

    def __init__(self, ctx: ServiceContext, powers: PlanPowers | None = None) -> None:
        self.ctx = ctx
        self.powers = powers

    def query(self, job_id: str, policy: PlanPolicy, *, steps: bool = False) -> bytes:
        """The plan ``policy`` selects as a JSON document (bytes, cached per frontier point)."""
        job = self.ctx.jobs.get(job_id)
        frontier = require_frontier(job)
        try:
            index = resolve_policy(frontier, policy)
        except InfeasibleError as e:
            raise policy_error(e, policy) from None
        cache = job.frontier.query_cache
        key = (index, steps)
        cached = cache.get(key)
        if cached is not None:
            return cached
        body = json.dumps(plan_doc(job, index, steps=steps, powers=self.powers)).encode()
        cache[key] = body
        return body
