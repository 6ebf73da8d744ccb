"""How the cluster power budget is shared between tenants.

Before each tenant's jobs share their tenant's part (``docs/power.md``, *Tenants*).

Each tenant whose jobs draw on the budget says what they can use: ``low`` (every job at its
least-power plan) and ``high`` (every job at its fastest), both with claims bounded by the
jobs' GPUs. :func:`split` gives each tenant

1. its **guaranteed** watts, as far as it can use them (``min(guaranteed, high)``; when the
   guarantees together exceed the budget, each is scaled down in proportion);
2. then, when that leaves every tenant able to run (each at least its ``low``), what it needs
   for that, so no tenant runs over the budget while another has watts to spare;
3. then the rest by **weight** (water-filling: a tenant never gets more than its ``high``;
   what it cannot use goes to the others, again by weight).

So no tenant is pushed below its guarantee, whatever the others create or claim; a tenant
that cannot fit in its part (its ``low`` is above it) runs its least-power plans and the
budget is reported unreachable, its over-run being its own. ``O(tenants^2)`` at worst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["TenantDemand", "TenantShare", "split"]

_EPS = 1e-9


@dataclass(frozen=True)
class TenantDemand:
    """What one tenant's budget-drawing jobs can use (W) and its terms."""

    tenant: str
    weight: float
    guaranteed: float
    low: float
    high: float


@dataclass(frozen=True)
class TenantShare:
    """One tenant's part of the budget (``watts``) and what its jobs were given.

    ``allocated``: the sum of their shares.
    """

    tenant: str
    watts: float
    allocated: float
    demand: float
    guaranteed: float
    #: Whether its jobs fit in its part (False: even their least-power plans exceed it).
    feasible: bool = True

    @property
    def owed(self) -> float:
        """What the tenant is guaranteed now: its guarantee, as far as its jobs can use it."""
        return min(self.guaranteed, self.demand)

    @property
    def below_guarantee(self) -> bool:
        """Whether its part is below what it is owed (should never be)."""
        return self.watts < self.owed * (1 - 1e-9) - 1e-6

    def gauge(self, name: str) -> float:
        """Its value of a ``perseus_tenant_power_*`` gauge."""
        if name == "perseus_tenant_power_demand_watts":
            return self.demand
        if name == "perseus_tenant_power_allocated_watts":
            return self.allocated
        if name == "perseus_tenant_below_guaranteed_share":
            return 1.0 if self.below_guarantee else 0.0
        if name == "perseus_tenant_power_budget_feasible":
            return 1.0 if self.feasible else 0.0
        raise KeyError(name)

    def to_json(self) -> dict[str, float | str | bool]:
        """The tenant's share as shown: watts, allocated watts, demand and guarantee."""
        return {
            "tenant": self.tenant,
            "watts": self.watts,
            "allocated_watts": self.allocated,
            "demand_watts": self.demand,
            "guaranteed_watts": self.guaranteed,
        }


def split(watts: float, demands: list[TenantDemand]) -> dict[str, float]:
    """Each tenant's part of ``watts`` (see the module docstring)."""
    floor = {d.tenant: min(d.guaranteed, d.high) for d in demands}
    total = math.fsum(floor.values())
    if total > watts:
        floor = {t: f * watts / total for t, f in floor.items()}
    lifted = {d.tenant: max(floor[d.tenant], d.low) for d in demands}
    part = lifted if math.fsum(lifted.values()) <= watts else floor
    left = watts - math.fsum(part.values())
    open_ = {d.tenant: d for d in demands if part[d.tenant] < d.high - _EPS}
    while left > _EPS and open_:
        weights = math.fsum(d.weight for d in open_.values())
        given = 0.0
        for t, d in list(open_.items()):
            share = left * d.weight / weights
            room = d.high - part[t]
            take = min(share, room)
            part[t] += take
            given += take
            if take >= room - _EPS:
                del open_[t]
        left -= given
        if given <= _EPS:
            break
    return part
