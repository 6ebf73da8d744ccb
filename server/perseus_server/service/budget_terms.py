"""The terms the cluster power budget works in (:mod:`perseus_server.service.power_budget`).

Its stored settings, the plan policy a job's share becomes, a job's straggler time, the least-power
shares an unreachable budget falls back to, and what one allocation produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from perseus.power import JobAllocation, PowerJob
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.service.state import Job
from perseus_server.service.tenant_shares import TenantShare

__all__ = [
    "ON_INFEASIBLE",
    "BudgetSettings",
    "BudgetResult",
    "BudgetShare",
    "JobDecider",
    "least_power_shares",
    "straggler_time",
]

#: What a budget that can no longer be met does (``PUT /power-budget`` ``on_infeasible``).
ON_INFEASIBLE = ("least_power", "keep_current")


@dataclass(frozen=True)
class BudgetSettings:
    """What ``PUT /power-budget`` set: watts, policy, and the jobs (``None``: every job)."""

    watts: float
    policy: str = "throughput"
    jobs: tuple[str, ...] | None = None
    on_infeasible: str = "least_power"

    def to_json(self) -> dict[str, Any]:
        """The settings as stored: watts, policy, covered jobs and what runs when infeasible."""
        return {
            "watts": self.watts,
            "policy": self.policy,
            "jobs": None if self.jobs is None else list(self.jobs),
            "on_infeasible": self.on_infeasible,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BudgetSettings:
        """Read :meth:`to_json`'s document."""
        jobs = doc.get("jobs")
        return cls(
            float(doc["watts"]),
            str(doc["policy"]),
            None if jobs is None else tuple(jobs),
            str(doc.get("on_infeasible", "least_power")),
        )


@dataclass(frozen=True)
class BudgetShare(PlanPolicy):
    """A job's share of the cluster budget, as the plan policy it runs (frontier point ``value``).

    Its description names the budget.
    """

    budget: float = 0.0
    rule: str = "throughput"
    watts: float = 0.0
    feasible: bool = True
    on_infeasible: str = "least_power"

    def describe(self) -> str:
        """The share in words for the plan's reason: the budget, the job's watts and point."""
        base = (
            f"cluster power budget {self.budget:g} W ({self.rule}): {self.watts:.6g} W for this "
            f"job, frontier point {int(self.value)}"
        )
        if self.feasible:
            return base
        return base + f" (the budget is unreachable: {self.on_infeasible.replace('_', ' ')})"


def straggler_time(job: Job) -> float | None:
    """The slowest straggler's iteration time ``T'`` (s, on the profile's axis).

    A re-solved slow-stage pipeline's fastest time is included; ``None`` without stragglers.
    """
    times = [s.time for s in job.stragglers.stragglers.values()]
    times += [
        float(st.frontier.times[0])
        for st in job.stragglers.slow_stages.values()
        if st.ready and st.frontier is not None
    ]
    return max(times) if times else None


def least_power_shares(jobs: list[PowerJob]) -> tuple[JobAllocation, ...]:
    """Every job at its least-power frontier point (what an unreachable budget falls back to)."""
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
class BudgetResult:
    """An allocation and the lowest achievable power of the covered jobs (W); the tenants' parts.

    When infeasible, the allocation is every job at its least power.
    """

    shares: tuple[JobAllocation, ...]
    feasible: bool
    lowest_power: float
    objective: float
    tenants: tuple[TenantShare, ...] = ()


class JobDecider(Protocol):
    """What the budget calls to re-deploy a job whose share changed.

    That is the :class:`~perseus_server.service.deployment.Deployer`.
    """

    def decide(self, job: Job, cause: str, *, force: bool = False) -> bool:
        """Re-decide and deploy ``job``'s plans for ``cause``.

        Returns whether a new plan was pushed.
        """
        ...
