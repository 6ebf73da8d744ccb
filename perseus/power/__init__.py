"""Power budgets: the power of plans, and plans under a power cap.

One job's fastest plan under a cap, one cap shared by several jobs, and the uniform settings
operators use today as baselines.

* :mod:`perseus.power.plan_power`: average and peak power of frontier plans, the fastest plan within
  a job's budget (:func:`plan_for_power_budget`), the relaxed bound's least time within it;
* :mod:`perseus.power.cluster`: one budget over several jobs (:func:`allocate_power`, a
  multiple-choice knapsack, ``throughput`` or ``fair``);
* :mod:`perseus.power.uniform`: a uniform per-GPU power limit and a uniform SM clock lock;
* :mod:`perseus.power.floors` and :mod:`perseus.power.swing`: power floors, and a plan and
  floors chosen together to bound the job's power swing and ramps
  (:func:`plan_for_swing`; the timeline itself: :mod:`perseus.power_timeline`).

See ``docs/power.md`` for the definitions and how the server exposes them.
"""

from __future__ import annotations

from perseus.power.cluster import SPLIT_RULES, Allocation, JobAllocation, PowerJob, allocate_power
from perseus.power.floors import (
    Floors,
    SwingBounds,
    least_floors,
    trough_fill_energy,
    uniform_floor,
)
from perseus.power.plan_power import (
    PowerBudgetError,
    PowerPlan,
    bound_time_for_power,
    deployment_power,
    index_for_power_budget,
    lowest_power,
    peak_power,
    peak_powers,
    plan_for_power_budget,
    point_powers,
    power_at,
)
from perseus.power.swing import SwingError, SwingPlan, plan_for_swing, swing_of
from perseus.power.uniform import (
    UniformPlan,
    clock_lock_plan,
    power_limit_plan,
    uniform_clock_lock,
    uniform_power_limit,
)

__all__ = [
    "PowerBudgetError",
    "PowerPlan",
    "point_powers",
    "power_at",
    "peak_power",
    "peak_powers",
    "lowest_power",
    "plan_for_power_budget",
    "index_for_power_budget",
    "deployment_power",
    "bound_time_for_power",
    "PowerJob",
    "JobAllocation",
    "Allocation",
    "allocate_power",
    "SPLIT_RULES",
    "UniformPlan",
    "power_limit_plan",
    "clock_lock_plan",
    "uniform_power_limit",
    "uniform_clock_lock",
    "SwingBounds",
    "Floors",
    "least_floors",
    "uniform_floor",
    "trough_fill_energy",
    "SwingError",
    "SwingPlan",
    "plan_for_swing",
    "swing_of",
]
