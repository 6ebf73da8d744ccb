"""One power budget over several jobs: which frontier point each job runs.

Problem (a multiple-choice knapsack). Job ``j`` runs ``g_j`` GPUs and must run exactly one of
its choices ``k`` (its frontier points, at their own time): average power ``p_jk`` (W, whole
job) and slowdown ``s_jk = T_jk / T_j - 1`` against its reference time ``T_j`` (all max clocks,
or the time a straggler imposes, if later). Subject to ``sum_j p_jk <= W``:

* ``throughput`` minimises ``sum_j g_j s_jk``, the GPU-time lost (GPUs idle-equivalent);
* ``fair`` minimises ``max_j s_jk``, then the GPU-time lost among the allocations that reach it.

Algorithm. ``throughput`` is solved as a 0-1 integer program (one binary per choice, one
equality per job, one budget row) by HiGHS's branch and bound (``scipy.optimize.milp``) to a
zero relative gap; HiGHS's dual bound is reported as the certificate (``bound``, ``gap``). The
budget row is tightened by a relative ``1e-9`` and the rounded solution is checked in exact
arithmetic; should rounding still exceed the budget, the job whose next choice costs least
slowdown per watt saved steps down until it fits (the gap then says what that cost). ``fair``
is exact by bisection over the distinct slowdowns: at a threshold ``s`` each job takes its
least-power choice with ``s_jk <= s`` (powers fall along a frontier), feasible iff their sum fits;
the least feasible threshold is then the constraint of a ``throughput`` solve.

Complexity: ``fair``'s bisection is ``O(N log N)`` for ``N`` choices in all; the integer program
has ``N`` binaries and ``J + 1`` rows (its LP relaxation, the convex-hull greedy of Sinha and
Zoltners, has at most two fractional variables, so branch and bound stays shallow).

Reference: P. Sinha and A. A. Zoltners, "The multiple-choice knapsack problem", Operations
Research 27(3) (1979).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from perseus.frontier import Frontier
from perseus.power.plans import PowerBudgetError, check_budget, check_shape, point_powers

__all__ = ["PowerJob", "JobAllocation", "Allocation", "allocate_power", "POLICIES"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Policy = Literal["throughput", "fair"]
#: The allocation policies.
POLICIES: tuple[str, ...] = ("throughput", "fair")
#: Relative tightening of the budget row handed to the integer program.
_TIGHTEN = 1e-9


@dataclass(frozen=True, eq=False)
class PowerJob:
    """One job's choices under a shared budget.

    Attributes:
        name: how the allocation names the job (the server's job id).
        gpus: GPUs the job runs (``pipelines * ranks * tensor_parallel``), its weight.
        times, powers: ``(k,)`` iteration time (s) and average power (W, whole job) of each
            choice, by increasing time and decreasing power.
        indices: ``(k,)`` the frontier point of each choice.
        reference_time: the time slowdowns are measured against (s).
    """

    name: str
    gpus: int
    times: FloatArray
    powers: FloatArray
    indices: IntArray
    reference_time: float

    @classmethod
    def from_frontier(
        cls,
        name: str,
        frontier: Frontier,
        *,
        pipelines: int = 1,
        tensor_parallel: int = 1,
        min_time: float | None = None,
    ) -> PowerJob:
        """The choices of a job whose pipelines all run one frontier point.

        ``min_time``: the iteration cannot be faster than this (a straggler the job waits for
        at the gradient sync); points faster than it collapse into the one that uses least
        energy over ``min_time`` waiting included, which runs ``min_time`` seconds, and the
        slowdown is measured against ``max(T0, min_time)``: the budget is not blamed for the
        straggler, and the headroom its waiting frees goes to the other jobs.
        """
        scale = check_shape(pipelines, tensor_parallel)
        gpus = scale * frontier.schedule.ranks
        powers = point_powers(frontier, pipelines=pipelines, tensor_parallel=tensor_parallel)
        times = frontier.times.astype(np.float64)
        idx = np.arange(len(frontier), dtype=np.int64)
        ref = frontier.max_frequency_time
        if min_time is not None and min_time > frontier.times[0]:
            first = frontier.index_for_deadline(min_time, wait=True)
            energy = frontier.energy_at(min_time)
            slower = np.flatnonzero(frontier.times > min_time)
            idx = np.concatenate([[first], slower]).astype(np.int64)
            times = np.concatenate([[min_time], frontier.times[slower]])
            powers = np.concatenate([[scale * energy / min_time], powers[slower]])
            ref = max(ref, float(min_time))
        return cls(name, gpus, times, powers, idx, float(ref))

    @property
    def slowdowns(self) -> FloatArray:
        return np.asarray(self.times / self.reference_time - 1.0, dtype=np.float64)

    @property
    def lowest_power(self) -> float:
        return float(self.powers.min())

    @property
    def max_power(self) -> float:
        return float(self.powers.max())


@dataclass(frozen=True)
class JobAllocation:
    """One job's share: the choice it runs, its power (W), time (s) and slowdown."""

    name: str
    index: int
    watts: float
    time: float
    slowdown: float
    gpus: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "watts": self.watts,
            "slowdown": self.slowdown,
            "point": self.index,
        }


@dataclass(frozen=True)
class Allocation:
    """The result of :func:`allocate_power`.

    Attributes:
        watts: the budget (W).
        policy: ``throughput`` or ``fair``.
        jobs: one share per job, in the order given.
        objective: the policy's value (GPU-time lost, or the largest slowdown).
        bound: a certified lower bound on the objective of any allocation within the budget.
        gap: ``objective - bound`` (0 when proven optimal).
    """

    watts: float
    policy: str
    jobs: tuple[JobAllocation, ...]
    objective: float
    bound: float

    @property
    def gap(self) -> float:
        return max(0.0, self.objective - self.bound)

    @property
    def allocated_watts(self) -> float:
        return math.fsum(j.watts for j in self.jobs)

    @property
    def gpu_time_lost(self) -> float:
        """``sum_j g_j s_j``: GPUs' worth of work lost to the budget."""
        return math.fsum(j.gpus * j.slowdown for j in self.jobs)

    @property
    def max_slowdown(self) -> float:
        return max(j.slowdown for j in self.jobs)

    def to_json(self) -> dict[str, Any]:
        """The body of the server's ``GET /power-budget``."""
        return {
            "watts": self.watts,
            "policy": self.policy,
            "allocated_watts": self.allocated_watts,
            "feasible": True,
            "jobs": [j.to_json() for j in self.jobs],
            "gap": self.gap,
        }


def allocate_power(
    jobs: Sequence[PowerJob],
    watts: float,
    *,
    policy: str = "throughput",
    time_limit: float = 10.0,
) -> Allocation:
    """The allocation of ``watts`` over ``jobs`` that is best for ``policy`` (module docstring).

    Raises:
        PowerBudgetError: ``watts`` is not a finite number > 0, or below the sum of the jobs'
            lowest powers (named in the message and in ``lowest_power``).
        ValueError: no jobs, two jobs with one name, or an unknown policy.
    """
    w = check_budget(watts)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not jobs:
        raise ValueError("a power budget needs at least one job")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError("job names must be distinct")
    lowest = math.fsum(j.lowest_power for j in jobs)
    if lowest > w:
        raise PowerBudgetError(
            f"no allocation fits {w:.6g} W; the lowest achievable is {lowest:.6g} W "
            f"(every job at its slowest plan)",
            budget=w,
            lowest_power=lowest,
        )
    masks = [np.ones(len(j.times), dtype=bool) for j in jobs]
    fair_value = -math.inf
    if policy == "fair":
        fair_value = _least_max_slowdown(jobs, w)
        masks = [j.slowdowns <= fair_value for j in jobs]
    choice, bound = _min_gpu_time_lost(jobs, masks, w, time_limit)
    shares = tuple(
        JobAllocation(
            j.name,
            int(j.indices[k]),
            float(j.powers[k]),
            float(j.times[k]),
            float(j.slowdowns[k]),
            j.gpus,
        )
        for j, k in zip(jobs, choice, strict=True)
    )
    if policy == "fair":
        value = max(s.slowdown for s in shares)
        return Allocation(w, policy, shares, value, min(value, fair_value))
    lost = math.fsum(s.gpus * s.slowdown for s in shares)
    return Allocation(w, policy, shares, lost, min(lost, bound))


def _least_max_slowdown(jobs: Sequence[PowerJob], w: float) -> float:
    """The least ``s`` such that every job's least-power choice with slowdown ``<= s`` fits."""
    levels = np.unique(np.concatenate([j.slowdowns for j in jobs]))

    def total(s: float) -> float:
        out = []
        for j in jobs:
            ok = j.slowdowns <= s
            out.append(j.powers[ok].min() if ok.any() else math.inf)
        return math.fsum(out)

    lo, hi = 0, len(levels) - 1  # levels[hi] fits: every job may take its slowest choice
    while lo < hi:
        mid = (lo + hi) // 2
        if total(float(levels[mid])) <= w:
            hi = mid
        else:
            lo = mid + 1
    return float(levels[lo])


def _min_gpu_time_lost(
    jobs: Sequence[PowerJob], masks: Sequence[npt.NDArray[np.bool_]], w: float, time_limit: float
) -> tuple[list[int], float]:
    """Each job's choice minimising ``sum g_j s_jk`` within ``w`` among the allowed choices
    (``masks``), and HiGHS's certified lower bound on that minimum."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    allowed = [np.flatnonzero(m) for m in masks]
    cost = np.concatenate([j.gpus * j.slowdowns[a] for j, a in zip(jobs, allowed, strict=True)])
    power = np.concatenate([j.powers[a] / w for j, a in zip(jobs, allowed, strict=True)])
    n = cost.size
    rows = np.zeros((len(jobs) + 1, n))
    start = 0
    for r, a in enumerate(allowed):
        rows[r, start : start + a.size] = 1.0
        start += a.size
    rows[-1] = power
    lower = np.concatenate([np.ones(len(jobs)), [-np.inf]])
    upper = np.concatenate([np.ones(len(jobs)), [1.0 - _TIGHTEN]])
    res = milp(
        cost,
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
        constraints=LinearConstraint(rows, lower, upper),
        options={"mip_rel_gap": 0.0, "time_limit": float(time_limit), "presolve": True},
    )
    if res.x is None:
        # the tightening alone made it infeasible: every job at its least-power allowed choice
        choice = [int(a[np.argmin(j.powers[a])]) for j, a in zip(jobs, allowed, strict=True)]
        return choice, -math.inf
    choice = []
    start = 0
    for a in allowed:
        choice.append(int(a[np.argmax(res.x[start : start + a.size])]))
        start += a.size
    choice = _repair(jobs, allowed, choice, w)
    bound = float(res.mip_dual_bound) if res.mip_dual_bound is not None else -math.inf
    return choice, bound


def _repair(
    jobs: Sequence[PowerJob], allowed: Sequence[IntArray], choice: list[int], w: float
) -> list[int]:
    """Step jobs down to lower-power choices, least slowdown per watt first, until the exact
    sum of powers fits ``w`` (only ever needed for rounding in the integer program)."""
    choice = list(choice)
    while math.fsum(float(j.powers[k]) for j, k in zip(jobs, choice, strict=True)) > w:
        best: tuple[float, int, int] | None = None
        for r, (j, a) in enumerate(zip(jobs, allowed, strict=True)):
            k = choice[r]
            cheaper = a[j.powers[a] < j.powers[k]]
            for c in cheaper:
                rate = j.gpus * (j.slowdowns[c] - j.slowdowns[k]) / (j.powers[k] - j.powers[c])
                if best is None or rate < best[0]:
                    best = (float(rate), r, int(c))
        if best is None:  # cannot happen: the least-power choices fit (checked by the caller)
            break
        choice[best[1]] = best[2]
    return choice
