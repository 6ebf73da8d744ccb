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

from typing import Any

import numpy as np

from perseus.errors import InfeasibleError, OptionError
from perseus.frontier import Frontier
from perseus.power import SwingBounds, SwingError, least_floors, plan_for_swing
from perseus.power.swing import deadline_for
from perseus.power_timeline import rank_power
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.errors import BadRequest
from perseus_server.service.state import Job

__all__ = [
    "DeployedFloors",
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


def _check_budget(policy: PlanPolicy, watts: float) -> None:
    """A 422 when the floors lift a power-budget policy's plan above its budget (W, whole job)."""
    if policy.kind == "power_budget" and watts > float(policy.value) * (1 + 1e-12):
        raise BadRequest(
            f"with its power floors the plan draws {watts:.1f} W on average, above the power "
            f"budget of {float(policy.value):.1f} W: loosen max_swing / max_ramp or raise the "
            "budget",
            field="max_swing",
            average_power=watts,
        )


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


def swing_doc(
    job: Job, frontier: Frontier, index: int, policy: PlanPolicy, bounds: SwingBounds, problem: Any
) -> dict[str, Any]:
    """What a plan document gains under ``bounds`` (and the plan it then runs)."""
    if problem is None:
        raise BadRequest(
            "the job's profile no longer describes its frontier's plans: re-solve it first",
            field="max_swing",
        )
    spec = job.spec
    try:
        sp = plan_for_swing(
            frontier,
            problem,
            bounds,
            deadline_for(frontier, index, policy.kind, policy.value),
            pipelines=spec.data_parallel,
            tensor_parallel=spec.tensor_parallel,
            max_evaluations=SEARCH_EVALUATIONS,
        )
    except SwingError as e:
        raise BadRequest(str(e), field="max_swing", least_swing=e.least_swing) from None
    except InfeasibleError as e:
        raise BadRequest(str(e), field="max_swing") from None
    _check_budget(policy, sp.energy / sp.time)
    windows = sorted({0.1, bounds.window})
    copies = spec.data_parallel * spec.tensor_parallel
    freqs = problem.frequencies_of(sp.plan)
    out: list[list[int]] = []
    k = 0
    for order in frontier.schedule.orders:
        out.append([int(f) for f in freqs[k : k + len(order)]])
        k += len(order)
    return {
        "index": sp.index,
        "time": sp.time,
        "energy": sp.plan_energy,
        "frequencies": out,
        "power_timeline": sp.timeline.to_json(windows=windows),
        "swing_bounds": bounds.to_json(),
        "power_floors": sp.floors.to_json(),
        "floor_energy": sp.floor_energy,
        "energy_with_floors": sp.energy,
        "plan_is_frontier_point": bool(np.array_equal(sp.plan, frontier.plans[sp.index])),
        "power_timeline_before": sp.before.scaled(copies).to_json(windows=windows),
    }


class DeployedFloors:
    """The power floors of deployed plans under a stored policy's swing bounds, cached.

    Per (job, frontier, point, bounds): each pipeline rank's least floors
    (:func:`perseus.power.least_floors` on the point's plan; the deployed plan is the policy's
    point, the floors chosen for it) and the job's swing with the plan alone. A pipeline whose
    plan differs from the others' (a straggler's) gets the floors of its own plan: each
    pipeline then keeps its own trough within the bound, so the job's sum does too.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._cache: dict[
            tuple[Any, ...], tuple[Any, list[list[tuple[float, float, float]]], float]
        ] = {}
        self._timelines: dict[tuple[Any, ...], tuple[Frontier, dict[str, Any]]] = {}

    def of(
        self, job: Job, frontier: Frontier, index: int, bounds: SwingBounds
    ) -> tuple[list[list[tuple[float, float, float]]], float] | None:
        """Every rank's floors and the plan's own swing; None without a fitting profile."""
        key = (job.id, id(frontier), index, bounds, id(job.profile.current))
        hit = self._cache.get(key)
        if hit is not None and hit[0] is frontier:
            return hit[1], hit[2]
        from perseus_server.service.plan_powers import job_problem

        problem = job_problem(job, frontier)
        if problem is None:
            return None
        rp = rank_power(problem, frontier.plans[index])
        floors = least_floors(rp, bounds, resolution=bounds.window / 20).ranks
        if len(self._cache) >= self._size:
            self._cache.clear()
        self._cache[key] = (frontier, floors, rp.total().swing)
        return floors, rp.total().swing

    def timeline(
        self, job: Job, frontier: Frontier, index: int, bounds: SwingBounds | None
    ) -> dict[str, Any] | None:
        """The deployed point's ``power_timeline`` (whole job) with ``samples`` to draw.

        With ``bounds``: the timeline with the floors, and ``before`` without them.
        """
        key = (job.id, id(frontier), index, bounds, id(job.profile.current))
        hit = self._timelines.get(key)
        if hit is not None and hit[0] is frontier:
            return dict(hit[1])
        from perseus_server.service.plan_powers import job_problem

        problem = job_problem(job, frontier)
        if problem is None:
            return None
        rp = rank_power(problem, frontier.plans[index])
        copies = job.spec.data_parallel * job.spec.tensor_parallel
        plain = rp.total(copies)
        after = plain
        if bounds is not None:
            after = least_floors(rp, bounds, resolution=bounds.window / 20).timeline.scaled(copies)
        doc = {**after.to_json(), "samples": _samples(after)}
        if bounds is not None:
            doc["before"] = {**plain.to_json(), "samples": _samples(plain)}
        if len(self._timelines) >= self._size:
            self._timelines.clear()
        self._timelines[key] = (frontier, doc)
        return dict(doc)

    def forget(self, job_id: str) -> None:
        """Drop a deleted job's floors."""
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
