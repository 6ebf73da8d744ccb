"""The power of plans, and one job's fastest plan under a power budget.

Definitions (``docs/power.md``). A frontier point ``i`` is a plan of one pipeline whose iteration
takes ``T_i`` seconds and ``E_i`` joules on all ``R`` ranks of that pipeline, waiting at the
blocking power ``P_b`` included. A job runs ``P`` such pipelines (data parallel), each rank
``d`` GPUs wide (tensor parallel); the profile measures one GPU of a stage, and the ``d`` GPUs of
a stage do the same work, so the job draws ``P * d`` times the pipeline's energy::

    average power (whole job, W) = P * d * E_i / T_i        on P * R * d GPUs

The functions here take the job's shape as ``pipelines`` (``P``, default 1) and
``tensor_parallel`` (``d``, default 1); budgets (``watts``) and average powers are the whole
job's, peak powers per GPU.

An iteration that lasts a deadline ``D`` longer than its plan's own time (the pipeline waits for a
straggler, or is paced) draws the blocking power for the rest, so its power is
``P * d * E(D) / D`` with ``E(D) = E_i + P_b * R * (D - T_i)``; the frontier's own
:meth:`~perseus.frontier.Frontier.energy_at` gives the least such ``E(D)``.

Peak power is per GPU: the highest ``e / t`` of any single instruction's option in the plan,
what a per-GPU power limit would see.

Along the frontier ``E_i - P_b R T_i`` strictly falls while ``T_i`` rises, so the points' own
average powers fall strictly too: the fastest plan within a budget is the first point under it,
found by one pass over the points (``O(k)`` for ``k`` points).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.errors import InfeasibleError
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem

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
    "check_budget",
    "check_shape",
]

FloatArray = npt.NDArray[np.float64]
PlanArray = npt.NDArray[np.uint8]

#: Relative slack when comparing a plan's power with a budget (floating point only).
_RTOL = 1e-12


class PowerBudgetError(InfeasibleError):
    """No plan meets a power budget, or the budget itself is not a number of watts.

    Attributes:
        budget: the budget asked for (W), as given.
        lowest_power: the lowest average power any plan achieves (W), when the budget was a
            number but below it; ``None`` for a budget that is not a finite number > 0.
    """

    def __init__(self, message: str, *, budget: float, lowest_power: float | None = None) -> None:
        super().__init__(message)
        self.budget = budget
        self.lowest_power = lowest_power


@dataclass(frozen=True)
class PowerPlan:
    """A job's plan under a power budget.

    Attributes:
        index: the frontier point.
        time: the iteration time (s): the plan's own time, or the deadline it waits until.
        energy: joules per iteration, whole job (all ``pipelines * tensor_parallel`` copies).
        average_power: ``energy / time`` (W, whole job).
        plan_time: the plan's own iteration time (s), ``<= time``.
        slowdown: ``time / T0 - 1`` against running everything at the highest frequency.
        pipelines, tensor_parallel: the job's shape the powers are for.
    """

    index: int
    time: float
    energy: float
    average_power: float
    plan_time: float
    slowdown: float
    pipelines: int = 1
    tensor_parallel: int = 1

    def to_json(self) -> dict[str, Any]:
        """The point as JSON: every attribute but the job's shape."""
        return {
            "index": self.index,
            "time": self.time,
            "energy": self.energy,
            "average_power": self.average_power,
            "plan_time": self.plan_time,
            "slowdown": self.slowdown,
        }


def check_shape(pipelines: int, tensor_parallel: int) -> int:
    """``pipelines * tensor_parallel`` after checking both are integers >= 1."""
    for name, v in (("pipelines", pipelines), ("tensor_parallel", tensor_parallel)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return int(pipelines) * int(tensor_parallel)


def check_budget(watts: float) -> float:
    """``watts`` as a float, or :class:`PowerBudgetError` unless it is a finite number > 0."""
    try:
        w = float(watts)
    except (TypeError, ValueError):
        raise PowerBudgetError(
            f"power budget must be a number of watts, got {watts!r}", budget=math.nan
        ) from None
    if not (math.isfinite(w) and w > 0):
        raise PowerBudgetError(
            f"power budget must be a finite number of watts > 0, got {watts!r}", budget=w
        )
    return w


def point_powers(frontier: Frontier, *, pipelines: int = 1, tensor_parallel: int = 1) -> FloatArray:
    """Average power (W, whole job) of every frontier point run at its own time."""
    scale = check_shape(pipelines, tensor_parallel)
    return np.asarray(scale * frontier.energies / frontier.times, dtype=np.float64)


def power_at(
    frontier: Frontier, deadline: float, *, pipelines: int = 1, tensor_parallel: int = 1
) -> float:
    """Average power (W, whole job) of an iteration lasting ``deadline`` seconds.

    The iteration runs the least-energy frontier plan within it: ``P * d * energy_at(deadline) /
    deadline``.
    """
    scale = check_shape(pipelines, tensor_parallel)
    return scale * frontier.energy_at(deadline) / deadline


def peak_power(problem: EnergyProblem, plan: PlanArray) -> float:
    """Per GPU: the highest power ``e / t`` (W) of any instruction's option in ``plan``."""
    idx = np.asarray(plan, dtype=np.int64)
    rows = np.arange(problem.num_nodes)
    return float(np.max(problem.energies[rows, idx] / problem.times[rows, idx]))


def peak_powers(frontier: Frontier, problem: EnergyProblem) -> FloatArray:
    """:func:`peak_power` of every frontier point (``problem`` must be the frontier's)."""
    if frontier.plans.shape[1] != problem.num_nodes:
        raise ValueError(
            f"the frontier's plans have {frontier.plans.shape[1]} instructions but the problem "
            f"has {problem.num_nodes}"
        )
    power = problem.energies / problem.times  # (n, K)
    rows = np.arange(problem.num_nodes)[None, :]
    return np.asarray(power[rows, frontier.plans.astype(np.int64)].max(axis=1), dtype=np.float64)


def lowest_power(
    frontier: Frontier, *, pipelines: int = 1, tensor_parallel: int = 1, wait: bool = False
) -> float:
    """The lowest average power (W, whole job) a plan reaches.

    That is the slowest point's at its own time; with ``wait=True`` the blocking power of every
    GPU, ``P * d * R * P_b``, which iterations stretched by waiting approach but never reach.
    """
    scale = check_shape(pipelines, tensor_parallel)
    if wait:
        return scale * frontier.blocking_power * frontier.schedule.ranks
    return float(point_powers(frontier, pipelines=pipelines, tensor_parallel=tensor_parallel).min())


def plan_for_power_budget(
    frontier: Frontier,
    watts: float,
    *,
    pipelines: int = 1,
    tensor_parallel: int = 1,
    wait: bool = False,
) -> PowerPlan:
    """The fastest plan whose average power (whole job) is at most ``watts``; ties: least energy.

    With ``wait=False`` (what deploying a point does) every plan runs at its own time: the
    answer is the first frontier point under the budget. With ``wait=True`` the iteration may
    also be stretched by waiting at blocking power (a pipeline paced to a deadline): the least
    ``D`` with ``P d E(D) <= watts * D`` (``E(D)``: :meth:`Frontier.energy_at`), which is
    ``min_i max(T_i, c_i / w)`` with ``c_i = E_i - P_b R T_i`` and ``w = watts / (P d) - P_b R``.

    Args:
        frontier: one pipeline's frontier.
        watts: the budget (W) for the whole job: every pipeline and tensor-parallel copy.
        pipelines: the job's data-parallel pipelines, each running ``frontier``'s plan.
        tensor_parallel: GPUs per pipeline stage (each draws the stage's power).
        wait: whether the iteration may be stretched past the plan's time by waiting.

    Raises:
        PowerBudgetError: ``watts`` is not a finite number > 0, or is below the lowest power
            (:func:`lowest_power`, named in the message and in ``lowest_power``).
    """
    w = check_budget(watts)
    scale = check_shape(pipelines, tensor_parallel)
    t0 = frontier.max_frequency_time
    if not wait:
        powers = point_powers(frontier, pipelines=pipelines, tensor_parallel=tensor_parallel)
        ok = np.flatnonzero(powers <= w * (1 + _RTOL))
        if ok.size == 0:
            low = float(powers.min())
            raise PowerBudgetError(
                f"no plan draws at most {w:.6g} W on average; the lowest achievable is "
                f"{low:.6g} W (the slowest plan, {frontier.times[-1]:.6g} s per iteration)",
                budget=w,
                lowest_power=low,
            )
        fastest = ok[frontier.times[ok] <= frontier.times[ok].min()]
        i = int(fastest[np.argmin(frontier.energies[fastest])])
        t, e = float(frontier.times[i]), float(frontier.energies[i])
        return PowerPlan(i, t, scale * e, scale * e / t, t, t / t0 - 1, pipelines, tensor_parallel)
    block = frontier.blocking_power * frontier.schedule.ranks
    headroom = w / scale - block
    if headroom <= 0:
        raise PowerBudgetError(
            f"no plan draws at most {w:.6g} W on average; even waiting draws "
            f"{scale * block:.6g} W (every GPU at blocking power)",
            budget=w,
            lowest_power=scale * block,
        )
    c = frontier.energies - block * frontier.times
    times = np.maximum(frontier.times, c / headroom)
    best = times.min()
    tied = np.flatnonzero(times <= best * (1 + _RTOL))
    energies = c[tied] + block * times[tied]
    i = int(tied[np.argmin(energies)])
    d = float(times[i])
    e = float(frontier.energies[i] + block * (d - frontier.times[i]))
    return PowerPlan(
        i, d, scale * e, scale * e / d, float(frontier.times[i]), d / t0 - 1,
        pipelines, tensor_parallel,
    )  # fmt: skip


def index_for_power_budget(
    frontier: Frontier, watts: float, *, pipelines: int = 1, tensor_parallel: int = 1
) -> int:
    """The frontier point of :func:`plan_for_power_budget` (plans at their own time)."""
    return plan_for_power_budget(
        frontier, watts, pipelines=pipelines, tensor_parallel=tensor_parallel
    ).index


def deployment_power(
    plans: Sequence[tuple[Frontier, int]],
    *,
    tensor_parallel: int = 1,
    deadline: float | None = None,
) -> tuple[float, float, float]:
    """``(time, energy, average_power)`` of an iteration whose pipelines run different plans.

    The data-parallel pipelines run ``plans[p] = (frontier, index)`` (a straggler's own
    re-solved frontier included).

    The pipelines meet at the gradient sync, so the iteration lasts the slowest plan's time (or
    ``deadline``, if later); every other pipeline waits at blocking power until then. Energy and
    power are for the whole job (``tensor_parallel`` GPUs per rank).
    """
    check_shape(1, tensor_parallel)
    if not plans:
        raise ValueError("a job has at least one pipeline")
    for f, i in plans:
        if not 0 <= i < len(f):
            raise IndexError(f"frontier point {i} out of range (the frontier has {len(f)})")
    t = max(float(f.times[i]) for f, i in plans)
    if deadline is not None:
        t = max(t, float(deadline))
    energy = sum(
        float(f.energies[i]) + f.blocking_power * f.schedule.ranks * (t - float(f.times[i]))
        for f, i in plans
    )
    energy *= tensor_parallel
    return t, energy, energy / t


def bound_time_for_power(
    frontier: Frontier, watts: float, *, pipelines: int = 1, tensor_parallel: int = 1
) -> float:
    """The least iteration time ``T`` the relaxed lower bound allows within ``watts`` (whole job).

    It is the least ``T`` with ``P d bound(T) <= watts * T`` (``bound``:
    :attr:`Frontier.relaxed_bound`, see :meth:`perseus.bound.RelaxedBound.time_for_power`). No
    plan meeting the budget is faster, waiting or not. Returns ``inf`` when no ``T`` qualifies
    (e.g. the budget is at or below the pipeline's blocking power). ``O(b)`` for ``b``
    breakpoints or tangent lines.
    """
    w = check_budget(watts) / check_shape(pipelines, tensor_parallel)
    if frontier.bound_times.size == 0:
        raise ValueError("the frontier carries no relaxed bound (bound_times is empty)")
    return frontier.relaxed_bound.time_for_power(w)
