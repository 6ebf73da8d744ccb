"""Swing-bounded plan answers: a policy's plan with the power floors that bound its swing.

``GET /jobs/{id}/plan?slowdown=0&max_swing=0.3&max_ramp=0.12`` (``docs/power.md``): the policy
sets the deadline (``deadline``: its value; ``slowdown``: ``T0 (1 + s)``; any other policy:
the time of the point it selects), :func:`perseus.power.plan_for_swing` picks the plan and the
per-rank floors of least energy within it, and the plan document gains ``power_floors`` (per
pipeline rank, ``[start_s, end_s, watts]``), ``floor_energy`` and ``energy_with_floors`` (J,
whole job), ``power_timeline`` (with the floors) and ``power_timeline_before`` (without). When
no pair meets the bounds: a 422 naming ``max_swing`` and the least swing reachable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perseus.errors import InfeasibleError, OptionError
from perseus.frontier import Frontier
from perseus.power import SwingBounds, SwingError, least_floors, plan_for_swing
from perseus.power.swing import SwingPlan, deadline_for
from perseus.power_timeline import PowerTimeline, rank_power
from perseus_common.wire.values import PlanStep
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.errors import BadRequest
from perseus_server.service.state import Job, RankPlans

__all__ = [
    "DeployedFloors",
    "DeployedPair",
    "BudgetError",
    "checked_search",
    "deployed_pair",
    "ramp_rate",
    "search",
    "SWING_FIELDS",
    "bounds_of",
    "swing_bounds",
    "swing_doc",
    "swing_items",
]

#: The query fields (and ``PUT`` body fields) of the swing bounds.
SWING_FIELDS = ("max_swing", "max_ramp", "ramp_window")

#: The search's budget per answer: plans evaluated with their floors.
SEARCH_EVALUATIONS = 200


def swing_bounds(given: dict[str, Any]) -> SwingBounds | None:
    """The bounds among a request's fields (None: no bound asked); a 422 naming a bad one."""
    swing, ramp, window = (given.get(k) for k in SWING_FIELDS)
    if swing is None and ramp is None:
        if window is not None:
            raise BadRequest("ramp_window needs max_ramp", field="ramp_window")
        return None
    try:
        return SwingBounds(swing, ramp, 0.1 if window is None else window)
    except OptionError as e:
        field = "ramp_window" if e.field == "window" else e.field
        raise BadRequest(str(e), field=field) from None


def swing_items(bounds: SwingBounds) -> tuple[tuple[str, float], ...]:
    """The bounds as a stored policy keeps them (``PlanPolicy.swing``)."""
    out = [("max_swing", bounds.max_swing), ("max_ramp", bounds.max_ramp)]
    return tuple((k, float(v)) for k, v in out if v is not None) + (
        ("ramp_window", float(bounds.window)),
    )


def bounds_of(policy: PlanPolicy) -> SwingBounds | None:
    """A stored policy's swing bounds (None: none)."""
    if not policy.swing:
        return None
    d = dict(policy.swing)
    return SwingBounds(d.get("max_swing"), d.get("max_ramp"), d.get("ramp_window", 0.1))


class BudgetError(InfeasibleError):
    """No plan with floors meeting the swing bounds keeps a power budget.

    Attributes:
        lowest_power: the least average power (W, whole job) a bounded pair reached.
    """

    def __init__(self, message: str, lowest_power: float) -> None:
        super().__init__(message)
        self.lowest_power = lowest_power


def search(
    job: Job,
    frontier: Frontier,
    index: int,
    kind: str,
    value: float,
    bounds: SwingBounds,
    problem: Any,
) -> SwingPlan:
    """The searched plan and floors within the deadline policy ``kind``/``value`` allows.

    One search for ``GET`` and ``PUT /jobs/{id}/plan`` alike (no time budget: the answer is a
    function of its inputs), so the pair a ``PUT`` deploys is the one the ``GET`` answers.
    Under a ``power_budget`` policy (``value``: W, whole job) the floors' energy counts against
    the budget: when the budget's point with its floors draws more, the fastest slower point
    whose pair keeps the budget (found by bisection; the average falls as the plans slow).
    Raises :class:`~perseus.power.SwingError`, :class:`BudgetError` or
    :class:`~perseus.errors.InfeasibleError`.
    """
    spec = job.spec

    def at(i: int) -> SwingPlan:
        return plan_for_swing(
            frontier,
            problem,
            bounds,
            deadline_for(frontier, i, kind, value),
            pipelines=spec.data_parallel,
            tensor_parallel=spec.tensor_parallel,
            max_evaluations=SEARCH_EVALUATIONS,
        )

    sp = at(index)
    if kind != "power_budget" or _average(sp) <= float(value) * (1 + 1e-12):
        return sp
    lo, hi = index + 1, len(frontier.times) - 1
    best = at(hi) if hi > index else sp
    if _average(best) > float(value) * (1 + 1e-12):
        raise BudgetError(
            f"with the power floors that max_swing / max_ramp need, no plan keeps the power "
            f"budget of {float(value):.1f} W: the least average is {_average(best):.1f} W; "
            "loosen the bounds or raise the budget",
            _average(best),
        )
    while lo < hi:
        mid = (lo + hi) // 2
        cand = at(mid)
        if _average(cand) <= float(value) * (1 + 1e-12):
            best, hi = cand, mid
        else:
            lo = mid + 1
    return best


def _average(sp: SwingPlan) -> float:
    """Average power (W, whole job) of a plan with its floors."""
    return sp.energy / sp.time


def ramp_rate(bounds: SwingBounds, job_peak_w: float, gpus: int) -> float:
    """Each GPU's power-smoothing ramp rate (W/s) under ``max_ramp``; 0: no ramp bound.

    The job's bound, ``max_ramp x peak`` per ``window``, shared evenly by its GPUs: when every
    GPU's floor moves at this rate at once, the job's power still changes by at most the bound
    within any window.
    """
    if bounds.max_ramp is None or gpus <= 0 or not job_peak_w > 0:
        return 0.0
    return float(bounds.max_ramp) * job_peak_w / bounds.window / gpus


def swing_doc(
    job: Job, frontier: Frontier, index: int, policy: PlanPolicy, bounds: SwingBounds, problem: Any
) -> dict[str, Any]:
    """What a plan document gains under ``bounds`` (and the plan it then runs)."""
    if problem is None:
        raise BadRequest(
            "the job's profile no longer describes its frontier's plans: re-solve it first",
            field="max_swing",
        )
    sp = checked_search(job, frontier, index, policy, bounds, problem)
    spec = job.spec
    windows = sorted({0.1, bounds.window})
    copies = spec.data_parallel * spec.tensor_parallel
    after = sp.floors.timeline.scaled(copies)
    return {
        "index": sp.index,
        "time": sp.time,
        "energy": sp.plan_energy,
        "frequencies": _frequencies(frontier, problem, sp.plan),
        "power_timeline": after.to_json(windows=windows),
        "swing_bounds": bounds.to_json(),
        "power_floors": sp.floors.to_json(),
        "ramp_w_per_s": ramp_rate(bounds, after.peak, copies * len(frontier.schedule.orders)),
        "floor_energy": sp.floor_energy,
        "energy_with_floors": sp.energy,
        "plan_is_frontier_point": bool(np.array_equal(sp.plan, frontier.plans[sp.index])),
        "power_timeline_before": sp.before.scaled(copies).to_json(windows=windows),
    }


def checked_search(
    job: Job, frontier: Frontier, index: int, policy: PlanPolicy, bounds: SwingBounds, problem: Any
) -> SwingPlan:
    """:func:`search` for ``policy``, its failures and a power budget it breaks as 422s.

    A ``power_budget`` policy's average power counts the floors: the answer (and a ``PUT``'s
    deployment) keeps the budget, or a 422 names ``power_budget`` and the least average.
    """
    try:
        return search(job, frontier, index, policy.kind, policy.value, bounds, problem)
    except SwingError as e:
        raise BadRequest(str(e), field="max_swing", least_swing=e.least_swing) from None
    except BudgetError as e:
        raise BadRequest(
            str(e), field="power_budget", fields=["power_budget", "max_swing", "max_ramp"],
            lowest_power=e.lowest_power,
        ) from None  # fmt: skip
    except InfeasibleError as e:
        raise BadRequest(str(e), field="max_swing") from None


def _frequencies(frontier: Frontier, problem: Any, plan: Any) -> list[list[int]]:
    """Per rank, the clock (MHz) of each of its instructions under ``plan``."""
    freqs = problem.frequencies_of(plan)
    out: list[list[int]] = []
    k = 0
    for order in frontier.schedule.orders:
        out.append([int(f) for f in freqs[k : k + len(order)]])
        k += len(order)
    return out


def _steps(frontier: Frontier, freqs: list[list[int]]) -> RankPlans:
    """Per rank, its wire steps in execution order (as ``Frontier.plan``) at ``freqs``."""
    return tuple(
        tuple(
            PlanStep(op.kind, op.microbatch, f, op.stage) for op, f in zip(order, rank, strict=True)
        )
        for order, rank in zip(frontier.schedule.orders, freqs, strict=True)
    )


@dataclass(frozen=True)
class DeployedPair:
    """What one pipeline runs under swing bounds: a plan and its floors, chosen together.

    Attributes:
        steps: per rank, the plan's steps; None: the frontier point's own.
        floors: per pipeline rank, ``(start_s, end_s, watts)``.
        plan_swing: the job's swing with the plan alone (what a GPU without floors gets).
        time: the plan's iteration time (s).
        ramp_w_per_s: each GPU's smoothing ramp rate (0: no ramp bound).
        timeline: one pipeline's power with the floors.
        before: ... and without them.
        searched: whether the pair is the search's (False: it failed, the point's least floors).
    """

    steps: RankPlans | None
    floors: list[list[tuple[float, float, float]]]
    plan_swing: float
    time: float
    ramp_w_per_s: float
    timeline: PowerTimeline
    before: PowerTimeline
    searched: bool


def deployed_pair(
    job: Job,
    frontier: Frontier,
    index: int,
    kind: str,
    value: float,
    bounds: SwingBounds,
    problem: Any,
) -> DeployedPair:
    """The searched pair for a deployed point (see :class:`DeployedPair`).

    When the search finds none (the bounds cannot be met within the deadline: a straggler's
    point, a profile that changed), the point's own plan with its least floors.
    """
    copies = job.spec.data_parallel * job.spec.tensor_parallel
    gpus = copies * len(frontier.schedule.orders)
    try:
        sp = search(job, frontier, index, kind, value, bounds, problem)
    except InfeasibleError:
        rp = rank_power(problem, frontier.plans[index])
        fl = least_floors(rp, bounds, resolution=bounds.window / 20)
        peak = fl.timeline.scaled(copies).peak
        return DeployedPair(
            None, fl.ranks, rp.total().swing, float(frontier.times[index]),
            ramp_rate(bounds, peak, gpus), fl.timeline, rp.total(), False,
        )  # fmt: skip
    own = bool(np.array_equal(sp.plan, frontier.plans[index]))
    steps = None if own else _steps(frontier, _frequencies(frontier, problem, sp.plan))
    peak = sp.floors.timeline.scaled(copies).peak
    return DeployedPair(
        steps, sp.floors.ranks, sp.before.swing, sp.time, ramp_rate(bounds, peak, gpus),
        sp.floors.timeline, sp.before, True,
    )  # fmt: skip


class DeployedFloors:
    """The plan and power floors deployed under a stored policy's swing bounds, cached.

    Per (job, frontier, point, policy, bounds): the searched pair (:func:`deployed_pair`), the
    same :func:`search` a ``GET /jobs/{id}/plan`` with the bounds answers, so what a ``PUT``
    deploys is what that ``GET`` shows. A pipeline whose point differs from the policy's (a
    straggler's) gets the pair searched within its own point's time: each pipeline then keeps
    its own trough within the bound, so the job's sum does too.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._cache: dict[tuple[Any, ...], tuple[Frontier, DeployedPair]] = {}
        self._timelines: dict[tuple[Any, ...], tuple[Frontier, dict[str, Any]]] = {}

    def pair(
        self, job: Job, frontier: Frontier, index: int, policy: PlanPolicy, bounds: SwingBounds
    ) -> DeployedPair | None:
        """The pipeline's searched pair; None without a fitting profile."""
        key = (job.id, id(frontier), index, policy.kind, policy.value, bounds,
               id(job.profile.current))  # fmt: skip
        hit = self._cache.get(key)
        if hit is not None and hit[0] is frontier:
            return hit[1]
        from perseus_server.service.plan_powers import job_problem

        problem = job_problem(job, frontier)
        if problem is None:
            return None
        found = deployed_pair(job, frontier, index, policy.kind, policy.value, bounds, problem)
        if len(self._cache) >= self._size:
            self._cache.clear()
        self._cache[key] = (frontier, found)
        return found

    def timeline(
        self, job: Job, frontier: Frontier, index: int, policy: PlanPolicy
    ) -> dict[str, Any] | None:
        """The deployed point's ``power_timeline`` (whole job) with ``samples`` to draw.

        Under the policy's swing bounds: the deployed pair's timeline with the floors, and
        ``before`` without them.
        """
        bounds = bounds_of(policy)
        key = (job.id, id(frontier), index, policy.kind, policy.value, bounds,
               id(job.profile.current))  # fmt: skip
        hit = self._timelines.get(key)
        if hit is not None and hit[0] is frontier:
            return dict(hit[1])
        doc = self._timeline_doc(job, frontier, index, policy, bounds)
        if doc is None:
            return None
        if len(self._timelines) >= self._size:
            self._timelines.clear()
        self._timelines[key] = (frontier, doc)
        return dict(doc)

    def _timeline_doc(
        self,
        job: Job,
        frontier: Frontier,
        index: int,
        policy: PlanPolicy,
        bounds: SwingBounds | None,
    ) -> dict[str, Any] | None:
        copies = job.spec.data_parallel * job.spec.tensor_parallel
        if bounds is None:
            from perseus_server.service.plan_powers import job_problem

            problem = job_problem(job, frontier)
            if problem is None:
                return None
            plain = rank_power(problem, frontier.plans[index]).total(copies)
            return {**plain.to_json(), "samples": _samples(plain)}
        found = self.pair(job, frontier, index, policy, bounds)
        if found is None:
            return None
        after, before = found.timeline.scaled(copies), found.before.scaled(copies)
        return {
            **after.to_json(),
            "samples": _samples(after),
            "before": {**before.to_json(), "samples": _samples(before)},
        }

    def forget(self, job_id: str) -> None:
        """Drop a deleted job's pairs."""
        for cache in (self._cache, self._timelines):
            for k in [k for k in cache if k[0] == job_id]:
                del cache[k]


#: The most step points of a timeline's ``samples`` (a long one is binned: each bin's lowest
#: and highest power, in time order, so the peak and the trough stay).
MAX_SAMPLES = 400


def _samples(tl: Any) -> dict[str, list[float]]:
    """``{"t", "w"}``: one iteration's steps (power ``w[k]`` from ``t[k]``), at most ``MAX_SAMPLES``."""
    t, w = tl.times[:-1], tl.watts
    if len(w) <= MAX_SAMPLES:
        return {"t": [round(float(x), 6) for x in t], "w": [round(float(x), 2) for x in w]}
    bins = np.minimum((t / tl.period * (MAX_SAMPLES // 2)).astype(np.int64), MAX_SAMPLES // 2 - 1)
    ts: list[float] = []
    ws: list[float] = []
    for b in range(MAX_SAMPLES // 2):
        sel = np.flatnonzero(bins == b)
        if sel.size == 0:
            continue
        lo, hi = sel[np.argmin(w[sel])], sel[np.argmax(w[sel])]
        for k in sorted({int(lo), int(hi)}):
            ts.append(round(float(t[k]), 6))
            ws.append(round(float(w[k]), 2))
    return {"t": ts, "w": ws}
