"""One power budget over several jobs: which frontier point each job runs.

Problem (a multiple-choice knapsack). Job ``j`` runs ``g_j`` GPUs and must run exactly one of
its choices ``k`` (its frontier points, at their own time): average power ``p_jk`` (W, whole
job) and slowdown ``s_jk = T_jk / T_j - 1`` against its reference time ``T_j`` (all max clocks,
or the time a straggler imposes, if later). Subject to ``sum_j p_jk <= W``:

* ``throughput`` minimises ``sum_j g_j s_jk``, the GPU-time lost (GPUs idle-equivalent);
* ``fair`` minimises ``max_j s_jk``, then the GPU-time lost among the allocations that reach it.

Algorithm. Both are exact. ``throughput``: a dynamic programme over the jobs that keeps only
the Pareto-optimal partial allocations in (power, GPU-time lost) (Nemhauser and Ullmann's
method for knapsacks): job by job, every kept state is extended by every choice, states that
cannot fit even with the remaining jobs at their lowest power are dropped, and of the rest only
those that no other state beats in both power and cost survive (a sort and a running minimum);
states that cannot beat a known allocation (the ``fair`` one below) are dropped too. The last
state costs least (ties: least power); backtracking gives each job's choice. Partial
sums are compared with the budget in floating point (to a relative ``1e-12``); the answer is the
cheapest final state whose exactly rounded sum fits, so it never exceeds the budget. ``fair``:
bisection over the distinct slowdowns; at a threshold ``s`` each job takes its least-power
choice with ``s_jk <= s`` (powers fall along a frontier), feasible iff their sum fits; the least
feasible threshold then restricts the choices of a ``throughput`` solve (the least GPU-time
lost among the fairest allocations).

Complexity: ``fair``'s bisection is ``O(N log N)`` for ``N`` choices in all; the programme costs
``O(sum_j S_j k_j log(S_j k_j))`` for ``S_j`` Pareto states before job ``j`` with ``k_j``
choices. ``S_j`` is at most the number of distinct power sums, in practice far fewer; it is
expanded in chunks so memory stays bounded. Thinning frontiers (:meth:`Frontier.thinned`)
bounds the work for many jobs.

Reference: G. L. Nemhauser and Z. Ullmann, "Discrete dynamic programming and capital
allocation", Management Science 15(9) (1969); the problem: P. Sinha and A. A. Zoltners, "The
multiple-choice knapsack problem", Operations Research 27(3) (1979).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from perseus.frontier import Frontier
from perseus.power.plan_power import PowerBudgetError, check_budget, check_shape, point_powers

__all__ = ["PowerJob", "JobAllocation", "Allocation", "allocate_power", "SPLIT_RULES"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
SplitRule = Literal["throughput", "fair"]
#: The rules a cluster budget is split by (the ``policy`` of a budget; not a plan policy of
#: :data:`perseus.policies.POLICIES`).
SPLIT_RULES: tuple[str, ...] = ("throughput", "fair")
#: Candidate states expanded at once by the dynamic programme (bounds its memory).
_CHUNK = 1 << 21


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
        """The slowdown of each choice relative to the reference time."""
        return np.asarray(self.times / self.reference_time - 1.0, dtype=np.float64)

    @property
    def lowest_power(self) -> float:
        """The least average power (W) among the choices."""
        return float(self.powers.min())

    @property
    def max_power(self) -> float:
        """The highest average power (W) among the choices."""
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
        """The job's share as JSON: id, watts, slowdown and frontier point."""
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
        objective: the policy's value (GPU-time lost, or the largest slowdown); optimal, so
            it is also the certified bound on any allocation within the budget (gap 0).
    """

    watts: float
    policy: str
    jobs: tuple[JobAllocation, ...]
    objective: float

    @property
    def allocated_watts(self) -> float:
        """The sum of the jobs' shares (W)."""
        return math.fsum(j.watts for j in self.jobs)

    @property
    def gpu_time_lost(self) -> float:
        """``sum_j g_j s_j``: GPUs' worth of work lost to the budget."""
        return math.fsum(j.gpus * j.slowdown for j in self.jobs)

    @property
    def max_slowdown(self) -> float:
        """The largest slowdown of any job."""
        return max(j.slowdown for j in self.jobs)

    def to_json(self) -> dict[str, Any]:
        """The body of the server's ``GET /power-budget``."""
        return {
            "watts": self.watts,
            "policy": self.policy,
            "allocated_watts": self.allocated_watts,
            "feasible": True,
            "jobs": [j.to_json() for j in self.jobs],
        }


def allocate_power(
    jobs: Sequence[PowerJob],
    watts: float,
    *,
    policy: str = "throughput",
) -> Allocation:
    """The allocation of ``watts`` over ``jobs`` that is best for ``policy`` (module docstring).

    Args:
        jobs: each job's frontier choices, GPUs and reference time; names must be distinct.
        watts: the budget (W) shared by all the jobs.
        policy: ``throughput`` (least GPU-time lost) or ``fair`` (least largest slowdown, then
            least GPU-time lost).

    Raises:
        PowerBudgetError: ``watts`` is not a finite number > 0, or below the sum of the jobs'
            lowest powers (named in the message and in ``lowest_power``).
        ValueError: no jobs, two jobs with one name, or an unknown policy.
    """
    w = check_budget(watts)
    if policy not in SPLIT_RULES:
        raise ValueError(f"policy must be one of {', '.join(SPLIT_RULES)}, got {policy!r}")
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
    fair_value = _least_max_slowdown(jobs, w)
    fairest = [j.slowdowns <= fair_value for j in jobs]
    # an allocation within the budget, whose cost bounds the programme's from above
    upper = math.fsum(
        j.gpus * float(j.slowdowns[np.flatnonzero(m)[np.argmin(j.powers[m])]])
        for j, m in zip(jobs, fairest, strict=True)
    )
    masks = fairest if policy == "fair" else [np.ones(len(j.times), dtype=bool) for j in jobs]
    choice = _min_gpu_time_lost(jobs, masks, w, upper)
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
        return Allocation(w, policy, shares, max(s.slowdown for s in shares))
    return Allocation(w, policy, shares, math.fsum(s.gpus * s.slowdown for s in shares))


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
    jobs: Sequence[PowerJob], masks: Sequence[npt.NDArray[np.bool_]], w: float, upper: float
) -> list[int]:
    """Each job's choice minimising ``sum g_j s_jk`` within ``w`` among the allowed choices.

    The allowed choices are ``masks``; ties: the least power. Exact: the Pareto dynamic
    programme of the module docstring; ``upper``, the cost of an allocation known to fit, prunes
    states that cannot beat it.
    """
    allowed = [np.flatnonzero(m) for m in masks]
    floor = [float(j.powers[a].min()) for j, a in zip(jobs, allowed, strict=True)]
    rest = [math.fsum(floor[r + 1 :]) for r in range(len(jobs))]  # least power of later jobs
    least = [float((j.gpus * j.slowdowns[a]).min()) for j, a in zip(jobs, allowed, strict=True)]
    rest_cost = [math.fsum(least[r + 1 :]) for r in range(len(jobs))]
    slack = w * (1 + 1e-12)
    ceiling = upper + 1e-9 * (1 + abs(upper))
    power = np.zeros(1)
    cost = np.zeros(1)
    levels: list[tuple[IntArray, IntArray]] = []
    for r, (j, a) in enumerate(zip(jobs, allowed, strict=True)):
        pj = j.powers[a]
        cj = j.gpus * j.slowdowns[a]
        step = max(1, _CHUNK // a.size)
        parts = []
        for lo in range(0, power.size, step):
            hi = min(power.size, lo + step)
            np_ = (power[lo:hi, None] + pj[None, :]).ravel()
            nc = (cost[lo:hi, None] + cj[None, :]).ravel()
            parent = np.repeat(np.arange(lo, hi, dtype=np.int64), a.size)
            choice = np.tile(a.astype(np.int64), hi - lo)
            fits = np_ + rest[r] <= slack  # rounding aside; checked exactly at the end
            fits &= nc + rest_cost[r] <= ceiling
            parts.append(_pareto(np_[fits], nc[fits], parent[fits], choice[fits]))
        merged = [np.concatenate(x) for x in zip(*parts, strict=True)]
        power, cost, parent, choice = _pareto(*merged)
        levels.append((parent, choice))
    # the Pareto set is by increasing power and strictly decreasing cost: the last state costs
    # least; step back only should the exactly rounded sum exceed the budget by a rounding
    for state in range(power.size - 1, -1, -1):
        picks = _backtrack(levels, state)
        if math.fsum(float(j.powers[k]) for j, k in zip(jobs, picks, strict=True)) <= w:
            return picks
    return [int(a[np.argmin(j.powers[a])]) for j, a in zip(jobs, allowed, strict=True)]


def _pareto(
    power: FloatArray, cost: FloatArray, parent: IntArray, choice: IntArray
) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """The states no other state beats in both power and cost, by increasing power.

    Ties: the first.
    """
    order = np.lexsort((cost, power))
    c = cost[order]
    before = np.concatenate([[np.inf], np.minimum.accumulate(c)[:-1]])
    keep = order[c < before]
    return power[keep], cost[keep], parent[keep], choice[keep]


def _backtrack(levels: Sequence[tuple[IntArray, IntArray]], state: int) -> list[int]:
    picks = []
    for parent, choice in reversed(levels):
        picks.append(int(choice[state]))
        state = int(parent[state])
    return picks[::-1]
