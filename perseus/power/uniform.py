"""What operators do today, as baselines: one power limit or one SM clock for every GPU.

* A uniform per-GPU power limit ``L`` (``nvidia-smi -pl``): every instruction runs at the
  highest clock whose measured power ``e / t`` is within ``L`` (the lowest clock when none is),
  and waiting draws the blocking power. The limit that meets a budget is found by bisection over
  the distinct option powers, the only values at which the plan changes: the highest limit whose
  plan's average power ``E / T`` is within the budget (``O(n K + log(n K))`` evaluations of
  ``O(n + m)`` each, ``n`` instructions with ``K`` options, ``m`` DAG edges).
* A uniform SM clock lock ``f`` (``nvidia-smi -lgc``): every instruction at the same clock (its
  highest measured clock ``<= f`` where it lacks ``f``); the highest ``f`` whose plan meets the
  budget, all clocks evaluated at once.

Budgets here are watts of the problem's one pipeline (all its ranks); a job of ``P`` pipelines
``d`` GPUs wide meets ``P * d`` times that with the same setting. Plans are evaluated exactly
with :meth:`~perseus.problem.EnergyProblem.evaluate_many`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.power.plan_power import PowerBudgetError, check_budget
from perseus.problem import EnergyProblem

__all__ = [
    "UniformPlan",
    "power_limit_plan",
    "clock_lock_plan",
    "uniform_power_limit",
    "uniform_clock_lock",
]

PlanArray = npt.NDArray[np.uint8]


@dataclass(frozen=True, eq=False)
class UniformPlan:
    """A uniform setting and the plan it gives.

    Attributes:
        setting: the power limit (W per GPU) or the clock (MHz).
        plan: option index of every instruction.
        time, energy: the plan's true iteration time (s) and energy (J, one pipeline).
    """

    setting: float
    plan: PlanArray
    time: float
    energy: float

    @property
    def average_power(self) -> float:
        """Average power (W): energy over time."""
        return self.energy / self.time


def _valid(problem: EnergyProblem) -> npt.NDArray[np.bool_]:
    k = problem.freqs.shape[1]
    return np.arange(k)[None, :] < problem.num_options[:, None]


def power_limit_plan(problem: EnergyProblem, limit: float) -> PlanArray:
    """Each instruction at its highest clock whose power ``e / t`` is at most ``limit`` W.

    Its lowest clock when none is.
    """
    power = problem.energies / problem.times
    ok = (power <= limit) & _valid(problem)
    first = np.argmax(ok, axis=1)  # options are by decreasing clock
    lowest = problem.num_options - 1
    return np.where(ok.any(axis=1), first, lowest).astype(np.uint8)


def clock_lock_plan(problem: EnergyProblem, clock: float) -> PlanArray:
    """Each instruction at its highest measured clock ``<= clock`` MHz (its lowest if none)."""
    ok = (problem.freqs <= clock) & _valid(problem)
    first = np.argmax(ok, axis=1)
    lowest = problem.num_options - 1
    return np.where(ok.any(axis=1), first, lowest).astype(np.uint8)


def uniform_power_limit(problem: EnergyProblem, watts: float) -> UniformPlan:
    """The highest uniform per-GPU power limit whose plan's average power is within ``watts``.

    The plan's average power ``E / T`` is at most ``watts`` (one pipeline); found by bisection
    over the option powers.

    Raises:
        PowerBudgetError: ``watts`` is bad, or even the lowest limit (every instruction at its
            least-power clock or below) exceeds it.
    """
    w = check_budget(watts)
    power = (problem.energies / problem.times)[_valid(problem)]
    limits = np.unique(power)

    def evaluate(limit: float) -> UniformPlan:
        plan = power_limit_plan(problem, limit)
        r = problem.evaluate(plan)
        return UniformPlan(float(limit), plan, r.time, r.energy)

    lo_plan = evaluate(float(limits[0]))
    if lo_plan.average_power > w * (1 + 1e-12):
        raise PowerBudgetError(
            f"no uniform power limit meets {w:.6g} W; the lowest limit gives "
            f"{lo_plan.average_power:.6g} W",
            budget=w,
            lowest_power=lo_plan.average_power,
        )
    top = evaluate(float(limits[-1]))
    if top.average_power <= w:
        return top
    lo, hi = 0, len(limits) - 1  # limits[lo] meets the budget, limits[hi] does not
    best = lo_plan
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = evaluate(float(limits[mid]))
        if r.average_power <= w:
            lo, best = mid, r
        else:
            hi = mid
    return best


def uniform_clock_lock(problem: EnergyProblem, watts: float) -> UniformPlan:
    """The highest SM clock, the same for every instruction, whose plan fits ``watts``.

    The plan's average power is at most ``watts`` (one pipeline).

    Raises:
        PowerBudgetError: ``watts`` is bad, or even the lowest clock exceeds it.
    """
    w = check_budget(watts)
    clocks = np.unique(problem.freqs[: problem.num_ops])[::-1]  # highest first (ops: clocked)
    plans = np.stack([clock_lock_plan(problem, float(f)) for f in clocks])
    t, e = problem.evaluate_many(plans)
    ok = np.flatnonzero(e / t <= w)
    if ok.size == 0:
        low = float((e / t).min())
        raise PowerBudgetError(
            f"no uniform clock meets {w:.6g} W; the lowest gives {low:.6g} W",
            budget=w,
            lowest_power=low,
        )
    i = int(ok[0])
    return UniformPlan(float(clocks[i]), plans[i], float(t[i]), float(e[i]))
