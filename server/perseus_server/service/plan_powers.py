"""The power of the plans the server reports (``docs/power.md``).

Every plan document, frontier point and deployment view carries ``average_power`` (W, whole job:
``data_parallel x tensor_parallel x E / T``, :func:`perseus.power.point_powers`, or
:func:`perseus.power.deployment_power` when pipelines run different plans) and ``peak_power``
(W per GPU: the hottest instruction option of the plan, :func:`perseus.power.peak_powers` with
the job's :class:`~perseus.problem.EnergyProblem`).

Both are computed once per frontier, vectorised over its points (``O(k n)`` for ``k`` points of
``n`` instructions), and cached until the job's frontier or profile changes. A plan document
also carries ``power_timeline`` (:mod:`perseus.power_timeline`: the job's power over one
iteration, its peak, trough, swing, largest change per window and band share), computed per
point on first use (``O(n log n)``) and cached with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.frontier import Frontier
from perseus.power import deployment_power, peak_powers, point_powers
from perseus.power_timeline import plan_timeline
from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus_server.service.state import Deployment, Job

__all__ = ["FramePowers", "PlanPowers"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class FramePowers:
    """The powers of one frontier's points: ``average`` and ``peak``.

    ``average`` (W, whole job) and ``peak`` (W per GPU; ``None`` when the job's profile no
    longer matches the frontier's options).
    """

    frontier: Frontier
    profile: Profile | None
    average: FloatArray
    peak: FloatArray | None
    problem: EnergyProblem | None = None
    timelines: dict[int, dict[str, Any]] = field(default_factory=dict)


def job_problem(job: Job, frontier: Frontier) -> EnergyProblem | None:
    """The job's problem for ``frontier``'s plans; None when its profile no longer fits them."""
    profile = job.profile.current
    if profile is None:
        return None
    try:
        problem = EnergyProblem.build(profile, frontier.schedule, job.spec.blocking_power)
    except ValueError:
        return None
    if problem.freqs.shape != frontier.node_freqs.shape or not np.array_equal(
        problem.freqs, frontier.node_freqs
    ):
        return None  # a newer profile measured other clocks: the plans' options differ
    return problem


class PlanPowers:
    """Average and peak power of a job's frontier points (cached per frontier and profile)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], FramePowers] = {}
        # per job, the latest deployment's powers and what they were computed from
        self._deployments: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def of(self, job: Job, frontier: Frontier | None = None) -> FramePowers:
        """The powers of ``frontier`` (default: the job's) for ``job``'s shape."""
        f = frontier if frontier is not None else job.frontier.current
        assert f is not None
        key = (job.id, id(f))
        hit = self._cache.get(key)
        if hit is not None and hit.frontier is f and hit.profile is job.profile.current:
            return hit
        problem = job_problem(job, f)
        powers = FramePowers(
            f,
            job.profile.current,
            point_powers(
                f, pipelines=job.spec.data_parallel, tensor_parallel=job.spec.tensor_parallel
            ),
            None if problem is None else peak_powers(f, problem),
            problem,
        )
        # keep only frontiers still in use by the job (its own, re-solved pipelines')
        live = {id(job.frontier.current)} | {
            id(st.frontier) for st in job.stragglers.slow_stages.values() if st.frontier
        }
        for k in [k for k in self._cache if k[0] == job.id and k[1] not in live]:
            del self._cache[k]
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = powers
        return powers

    def forget(self, job_id: str) -> None:
        """Drop the job's cached powers (the job was deleted)."""
        for k in [k for k in self._cache if k[0] == job_id]:
            del self._cache[k]
        self._deployments.pop(job_id, None)

    def point(self, job: Job, index: int, frontier: Frontier | None = None) -> dict[str, Any]:
        """``{"average_power", "peak_power", "power_timeline"}`` of one point."""
        p = self.of(job, frontier)
        return {
            "average_power": float(p.average[index]),
            "peak_power": None if p.peak is None else float(p.peak[index]),
            "power_timeline": self.timeline(job, index, frontier),
        }

    def timeline(
        self, job: Job, index: int, frontier: Frontier | None = None
    ) -> dict[str, Any] | None:
        """Point ``index``'s ``power_timeline`` (whole job); None without a fitting profile."""
        p = self.of(job, frontier)
        if p.problem is None:
            return None
        hit = p.timelines.get(index)
        if hit is None:
            tl = plan_timeline(
                p.problem,
                p.frontier.plans[index],
                pipelines=job.spec.data_parallel,
                tensor_parallel=job.spec.tensor_parallel,
            )
            hit = p.timelines[index] = tl.to_json()
        return hit

    def annotate_points(self, job: Job, status: dict[str, Any]) -> dict[str, Any]:
        """``status`` (``GET /jobs/{id}/frontier``) with both powers added to every point."""
        points = status.get("points")
        if not points or job.frontier.current is None:
            return status
        p = self.of(job)
        avg = p.average.tolist()
        peak = p.peak.tolist() if p.peak is not None else [None] * len(avg)
        for doc in points:
            i = doc["index"]
            doc["average_power"], doc["peak_power"] = avg[i], peak[i]
        return status

    def deployment(self, job: Job, dep: Deployment, frontiers: list[Frontier]) -> dict[str, Any]:
        """The whole deployment's powers: ``average_power``, ``peak_power`` and ``pipelines``.

        ``average_power`` (W, whole job, waiting for the slowest pipeline included) and
        ``peak_power`` (W per GPU, the hottest pipeline's); ``pipelines``: each pipeline's
        own ``{"average_power", "peak_power"}`` (W, its share: ``tensor_parallel x E / T``).

        Kept per job until the deployment, a frontier or the profile changes (the job status
        asks for it on every request; at 512 pipelines it took longer than the rest of the
        plan's view): the same ``pipelines`` list comes back while nothing changed, the outer
        dict is new each time.
        """
        key = (dep, job.profile.current, *frontiers)
        hit = self._deployments.get(job.id)
        if (
            hit is not None
            and len(hit[0]) == len(key)
            and all(a is b for a, b in zip(hit[0], key, strict=True))
        ):
            return dict(hit[1])
        doc = self._deployment(job, dep, frontiers)
        self._deployments[job.id] = (key, doc)
        return dict(doc)

    def _deployment(self, job: Job, dep: Deployment, frontiers: list[Frontier]) -> dict[str, Any]:
        d = job.spec.tensor_parallel
        plans = list(zip(frontiers, dep.indices, strict=True))
        _, _, average = deployment_power(plans, tensor_parallel=d)
        per = []
        for f, i in plans:
            peak = self.of(job, f).peak
            per.append(
                {
                    "average_power": d * float(f.energies[i]) / float(f.times[i]),
                    "peak_power": None if peak is None else float(peak[i]),
                }
            )
        peaks = [p["peak_power"] for p in per if p["peak_power"] is not None]
        return {
            "average_power": average,
            "peak_power": max(peaks) if peaks else None,
            "pipelines": per,
        }
