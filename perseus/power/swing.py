"""Swing-bounded plans: a plan and per-rank power floors chosen together.

Given a job's frontier, a deadline (any deadline policy's: ``T0 (1 + slowdown)``, a deadline,
...) and :class:`~perseus.power.floors.SwingBounds`, :func:`plan_for_swing` returns the pair of
a plan finishing within the deadline and the least floors (:func:`~perseus.power.floors.
least_floors`) that keep the job's power within the bounds, of least total energy, floors
included. The plan is searched, not taken as given:

1. every frontier point within the deadline is a candidate (up to ``max_points`` of them,
   spread evenly), each with its least floors; a slower point with a shallower trough can
   beat a faster one whose floors cost more;
2. from the best, a local search (``local=True``) moves clocks around the peak and the
   troughs: slowing an instruction that runs at the peak (lowering the peak lowers the
   trough the swing bound asks for), speeding up one of its neighbours on the same rank to
   make the room; then changing one instruction's clock by one or two steps: those running
   in the troughs (below the swing bound's level plus one ramp step) or within 3 % of the
   peak, troughs first, then, when none of those saves, every instruction (where the floors bind, a faster clock's extra power is drawn
   anyway, and the time it frees lets others slow down); a move is kept when the plan still
   finishes within the deadline and plan plus floors costs less (moves that even the
   trough filled alone, the ramp ignored, would not save are screened out before the
   floors are computed). The result need
   not be a frontier point (``SwingPlan.index`` is the point it started from).

Floors are searched at ``window / 5`` cells and the final answer's at ``window / 20``.
When even the least floors cannot meet the bounds, which happens only when the bounds are
impossible to meet with a bounded GPU power (``max_swing = 0`` is met by a flat floor at the
peak), :class:`SwingError` names the least swing reachable.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.errors import InfeasibleError
from perseus.frontier import Frontier
from perseus.power.floors import Floors, SwingBounds, floor_energy, least_floors, meets
from perseus.power_timeline import (
    PowerTimeline,
    RankPower,
    _node_schedule,
    rank_power,
    rank_power_of,
)
from perseus.problem import EnergyProblem

__all__ = ["SwingError", "SwingPlan", "deadline_for", "plan_for_swing", "swing_of"]

PlanArray = npt.NDArray[np.uint8]


class SwingError(InfeasibleError):
    """No plan and floors meet the bounds.

    Attributes:
        least_swing: the least swing any plan within the deadline reaches with floors that
            keep its ramps within bound (``None`` if not known).
    """

    def __init__(self, message: str, *, least_swing: float | None = None) -> None:
        super().__init__(message)
        self.least_swing = least_swing


@dataclass(frozen=True)
class SwingPlan:
    """A plan and its floors (one pipeline; the job's copies run the same).

    Attributes:
        index: the frontier point the plan is (or started from).
        plan: option indices per DAG node.
        time: the plan's iteration time (s).
        plan_energy: joules per iteration without floors (one pipeline).
        floors: the per-rank floors, their energy (one pipeline) and the timeline with them.
        before: the pipeline's timeline without floors.
        bounds: what was asked.
        copies: pipelines x tensor-parallel GPUs per rank.
        evaluations: plans (with floors) evaluated by the search.
    """

    index: int
    plan: PlanArray
    time: float
    plan_energy: float
    floors: Floors
    before: PowerTimeline
    bounds: SwingBounds
    copies: int = 1
    evaluations: int = field(default=0, compare=False)

    @property
    def energy(self) -> float:
        """Joules per iteration, whole job, floors included."""
        return (self.plan_energy + self.floors.energy) * self.copies

    @property
    def floor_energy(self) -> float:
        """Joules per iteration the floors add, whole job."""
        return self.floors.energy * self.copies

    @property
    def timeline(self) -> PowerTimeline:
        """The job's power with the floors."""
        return self.floors.timeline.scaled(self.copies)

    def to_json(self) -> dict[str, Any]:
        """``swing``: the bounds, energies and the floors (``power_floors``)."""
        return {
            "bounds": self.bounds.to_json(),
            "index": self.index,
            "time": self.time,
            "energy": self.energy,
            "plan_energy": self.plan_energy * self.copies,
            "floor_energy": self.floor_energy,
            "power_floors": self.floors.to_json(),
        }


def deadline_for(frontier: Frontier, index: int, kind: str, value: float) -> float:
    """The time a plan policy allows: a deadline's, a slowdown's, else its point's own time."""
    own = float(frontier.times[index])
    if kind == "deadline":
        return max(own, float(value))
    if kind == "slowdown":
        return max(own, frontier.max_frequency_time * (1 + float(value)))
    return own


def swing_of(problem: EnergyProblem, plan: PlanArray) -> float:
    """The swing of ``plan`` alone (no floors): what a GPU that cannot hold a floor gets."""
    return rank_power(problem, plan).total().swing


def _cost(problem: EnergyProblem, plan: PlanArray, bounds: SwingBounds, res: float) -> float:
    rp = rank_power(problem, plan)
    return rp.total().energy + floor_energy(rp, bounds, resolution=res)


def _screen(rp: RankPower, bounds: SwingBounds) -> float:
    """A quick lower estimate of plan plus floors: the trough filled, the ramp ignored."""
    total = rp.watts.sum(axis=0)
    dt = np.diff(rp.times)
    low = (1.0 - (bounds.max_swing if bounds.max_swing is not None else 1.0)) * total.max()
    return float(np.dot(dt, total) + np.dot(dt, np.maximum(0.0, low - total)))


def _candidates(frontier: Frontier, deadline: float, max_points: int) -> list[int]:
    ok = np.flatnonzero(frontier.times <= deadline * (1 + 1e-12))
    if ok.size == 0:
        raise InfeasibleError(
            f"no plan finishes within {deadline:.6g} s; the fastest plan takes "
            f"{frontier.times[0]:.6g} s"
        )
    if ok.size <= max_points:
        return ok.tolist()
    pick = np.unique(np.round(np.linspace(0, ok.size - 1, max_points)).astype(np.int64))
    return ok[pick].tolist()


@dataclass
class _Search:
    """The local search's state: the best plan so far and what it costs."""

    problem: EnergyProblem
    bounds: SwingBounds
    deadline: float
    res: float
    plan: PlanArray
    cost: float
    budget: int
    stop_at: float = math.inf
    evaluations: int = 0
    slack: float = 0.0

    def attempt(self, plan: PlanArray) -> float:
        """The cost of ``plan``, ``inf`` past the deadline or the budget."""
        if self.evaluations >= self.budget or time.perf_counter() > self.stop_at:
            return math.inf
        self.evaluations += 1
        es, d, e = _node_schedule(self.problem, plan)
        if float((es + d).max()) > self.deadline * (1 + 1e-12):
            return math.inf
        rp = rank_power_of(self.problem, es, d, e)
        if _screen(rp, self.bounds) >= self.cost - self.slack:
            return math.inf  # even the trough alone filled would not save
        return rp.total().energy + floor_energy(rp, self.bounds, resolution=self.res)

    def peak_ops(self) -> list[int]:
        """Instructions running at the five highest pieces of the plan's power."""
        es, d, _ = _node_schedule(self.problem, self.plan)
        rp = rank_power(self.problem, self.plan)
        total = rp.watts.sum(axis=0)
        n = self.problem.dag.num_ops
        out: set[int] = set()
        for k in np.argsort(-total)[:5].tolist():
            mid = 0.5 * (rp.times[k] + rp.times[k + 1])
            out |= set(np.flatnonzero((es[:n] <= mid) & (es[:n] + d[:n] > mid)).tolist())
        return sorted(out)

    def peak_moves(self) -> bool:
        """Slow one instruction at the peak, speeding a rank neighbour up; keep the best."""
        problem, rank = self.problem, self.problem.dag.rank
        best: tuple[float, PlanArray] | None = None
        for x in self.peak_ops():
            if self.plan[x] + 1 >= problem.num_options[x]:
                continue
            same = np.flatnonzero(rank[: problem.dag.num_ops] == rank[x])
            pos = int(np.searchsorted(same, x))
            for y in [-1, *same[max(0, pos - 3) : pos + 4].tolist()]:
                for step in (1, 2) if y >= 0 else (0,):
                    trial = self.plan.copy()
                    trial[x] += 1
                    if y >= 0:
                        if y == x or trial[y] < step:
                            continue
                        trial[y] -= step
                    c = self.attempt(trial)
                    if c < self.cost - 1e-6 and (best is None or c < best[0]):
                        best = (c, trial)
        if best is None:
            return False
        self.cost, self.plan = best
        return True

    def trough_order(self, everywhere: bool = False) -> list[int]:
        """Instructions by the job's power at their middle, lowest first (troughs first).

        Only those in the troughs (below the swing bound's level plus one ramp step) or near
        the peak (within 3 %), unless ``everywhere``.
        """
        es, d, _ = _node_schedule(self.problem, self.plan)
        rp = rank_power(self.problem, self.plan)
        total = rp.watts.sum(axis=0)
        n = self.problem.dag.num_ops
        mid = es[:n] + d[:n] / 2
        k = np.clip(np.searchsorted(rp.times, mid, side="right") - 1, 0, len(total) - 1)
        order = np.argsort(total[k], kind="stable")
        if everywhere:
            return order.tolist()
        peak, b = float(total.max()), self.bounds
        low = (1 - (b.max_swing if b.max_swing is not None else 1.0)) * peak
        low += (b.max_ramp if b.max_ramp is not None else 0.0) * peak
        at = total[k][order]
        return order[(at <= low) | (at >= 0.97 * peak)].tolist()

    def single_moves(self, everywhere: bool = False) -> bool:
        """One pass of clock changes by one or two steps, troughs first, kept when they save."""
        improved = False
        for v in self.trough_order(everywhere):
            for step in (-2, -1, 1, 2):
                k = int(self.plan[v]) + step
                if not 0 <= k < self.problem.num_options[v]:
                    continue
                trial = self.plan.copy()
                trial[v] = k
                c = self.attempt(trial)
                if c < self.cost - 1e-6:
                    self.cost, self.plan, improved = c, trial, True
                    break
        return improved


def plan_for_swing(
    frontier: Frontier,
    problem: EnergyProblem,
    bounds: SwingBounds,
    deadline: float,
    *,
    pipelines: int = 1,
    tensor_parallel: int = 1,
    local: bool = True,
    max_points: int = 24,
    max_evaluations: int = 600,
    max_floor: float | None = None,
    time_budget: float | None = None,
) -> SwingPlan:
    """The least-energy plan and floors within ``deadline`` that meet ``bounds``.

    The local search stops after ``max_evaluations`` plans or ``time_budget`` seconds.
    ``max_floor``: the highest floor a GPU can hold (W); floors above it raise
    :class:`SwingError` naming the least swing reachable (every GPU held at ``max_floor``).
    """
    res = bounds.window / 5
    stop_at = math.inf if time_budget is None else time.perf_counter() + time_budget
    scored = [
        (_cost(problem, frontier.plans[i], bounds, res), i)
        for i in _candidates(frontier, deadline, max_points)
    ]
    cost, index = min(scored)
    search = _Search(
        problem, bounds, deadline, res, frontier.plans[index].copy(), cost, max_evaluations, stop_at
    )
    if local and bounds.bounded:
        while search.peak_moves():
            pass
        while search.single_moves() or search.single_moves(everywhere=True):
            pass
    rp = rank_power(problem, search.plan)
    floors = least_floors(rp, bounds, resolution=bounds.window / 20)
    highest = max((w for r in floors.ranks for _, _, w in r), default=0.0)
    if not meets(floors.timeline, bounds) or (max_floor is not None and highest > max_floor):
        least = _least_swing(problem, frontier, deadline, max_floor)
        raise SwingError(
            f"no plan within {deadline:.6g} s meets max_swing={bounds.max_swing} and "
            f"max_ramp={bounds.max_ramp} with floors of at most {max_floor} W per GPU; "
            f"the least swing reachable is {least:.3f}",
            least_swing=least,
        )
    return SwingPlan(
        index=index,
        plan=search.plan,
        time=float(problem.evaluate(search.plan).time),
        plan_energy=rp.total().energy,
        floors=floors,
        before=rp.total(),
        bounds=bounds,
        copies=pipelines * tensor_parallel,
        evaluations=search.evaluations + len(scored),
    )


def _least_swing(
    problem: EnergyProblem, frontier: Frontier, deadline: float, max_floor: float | None
) -> float:
    """The least swing of a frontier plan within ``deadline``, every GPU held at ``max_floor``."""
    best = math.inf
    for i in _candidates(frontier, deadline, 10**9):
        rp = rank_power(problem, frontier.plans[i])
        level = 0.0 if max_floor is None else max_floor
        best = min(best, PowerTimeline(rp.times, np.maximum(rp.watts, level).sum(axis=0)).swing)
    return float(best)
