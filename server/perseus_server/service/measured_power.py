"""Measured power and energy saved per job, from the ranks' iteration reports.

See ``docs/power.md``, "Measured power and energy saved".

Every report that carries an energy reading (``energy > 0``; the client sends 0 when it did not
measure) and does not come from an online profiling scan counts. Per rank ``r`` the server keeps:

* for the plan version of its latest report, the sums ``E_r`` (J) and ``T_r`` (s) of its
  reports' energies and iteration times: its measured power ``p_r = E_r / T_r``;
* over every report counted since the server started, the measured energy and the energy the
  same iterations would have taken at max clocks (below), and how many reports.

**Measured average power** (W, whole job): over the ranks whose latest plan version is the
newest any rank reported (``R`` of them, the job's world size ``W = pipelines x ranks x
tensor-parallel``), ``W / R * sum_r p_r``: the sum of what the ranks report when every rank
reports, scaled to the whole job like a plan's ``average_power`` when only some do.

**Max-clock energy** of an iteration a rank ran in ``t`` seconds: what the rank's GPU would
have drawn in those ``t`` seconds running every instruction at the top clock, then waiting at
blocking power ``P_b``: ``C_r + P_b * (t - B_r)``, where ``C_r`` and ``B_r`` are the energy and
the busy time of the rank's instructions at the top clock (the profile's first option, as the
frontier's max-clock point ``(T0, E0)`` uses them: summed over one pipeline's ranks at
``t = T0`` this is ``E0``). So a pipeline held up by a straggler is compared with max clocks held
up the same way, and time the profile does not cover (the optimizer step, data loading) counts
as waiting in the baseline.

**Energy saved** (J, whole job): ``W / R' * sum_r (max-clock energy - measured energy)`` over
the counted reports, ``R'`` the ranks that reported energy. It is a net figure (a report may save
less than nothing, e.g. max clocks measured with noise), so ``perseus_energy_saved_joules``
is exported as a gauge; it counts from the server's start (``perseus_start_time_seconds``; not
stored). While the job's profile does not describe its measured iterations (a profile mismatch,
``service/stragglers.py``), the max-clock and saved figures are withheld: ``None`` with the
reason, and no ``perseus_energy_saved_joules`` sample.

A report outside the sane ranges ``MIN_SECONDS <= iteration_time <= MAX_SECONDS`` (the upper
bound the straggler API uses too) and ``energy <= MAX_ENERGY`` (10 kW for ``MAX_SECONDS``) is
not counted, nor one that would make a rank's sums or power not finite: with bounded inputs the
job's sums stay finite (e.g. ``energy=1e308`` twice or ``iteration_time=5e-324`` would otherwise
overflow them), and a view shows ``None`` for a power that is not finite, so the status stays
valid JSON whatever the ranks send.

Cost: ``O(1)`` per report (the per-rank constants are computed once per profile and frontier,
``O(n)`` for ``n`` instructions); a view or a scrape is one pass over the job's ranks, kept
until the next counted report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus_server.domain.bounds import MAX_ENERGY, MAX_SECONDS, MIN_SECONDS
from perseus_server.domain.states import ProfilingStatus
from perseus_server.metric_series import Labels
from perseus_server.service.report_checks import CheckedReport
from perseus_server.service.state import Job, JobTable

__all__ = [
    "MAX_ENERGY",
    "MAX_SECONDS",
    "MIN_SECONDS",
    "MaxClockBaseline",
    "MeasuredPower",
    "max_clock_baseline",
]


@dataclass(frozen=True)
class MaxClockBaseline:
    """Per pipeline rank, the energy and busy time of its instructions at the top clock.

    The energy ``compute[r]`` (J) and busy time ``busy[r]`` (s) of its instructions at the top
    clock; ``blocking_power`` (W) for the rest of an iteration.
    """

    compute: tuple[float, ...]
    busy: tuple[float, ...]
    blocking_power: float

    def energy(self, rank: int, seconds: float) -> float:
        """The max-clock energy (J) of one GPU of pipeline rank ``rank`` over ``seconds``.

        Over an iteration of ``seconds``: its instructions at the top clock, waiting at
        blocking power otherwise.
        """
        return self.compute[rank] + self.blocking_power * (seconds - self.busy[rank])


def max_clock_baseline(profile: Profile, frontier: Frontier) -> MaxClockBaseline | None:
    """The baseline of ``frontier``'s schedule on ``profile`` (None when they do not match)."""
    try:
        problem = EnergyProblem.build(profile, frontier.schedule, frontier.blocking_power)
    except ValueError:
        return None
    ranks = problem.dag.rank  # every node's rank: ops, transfers (receiver's), phases
    n = frontier.schedule.ranks
    compute = np.bincount(ranks, weights=problem.energies[:, 0], minlength=n)
    busy = np.bincount(ranks, weights=problem.times[:, 0], minlength=n)
    return MaxClockBaseline(
        tuple(float(x) for x in compute), tuple(float(x) for x in busy), frontier.blocking_power
    )


@dataclass
class _RankEnergy:
    """One rank's sums (see the module docstring)."""

    version: int = -1
    energy: float = 0.0
    time: float = 0.0
    reports: int = 0
    measured: float = 0.0
    max_clock: float = 0.0
    counted: int = 0


@dataclass
class _JobEnergy:
    ranks: dict[str, _RankEnergy] = field(default_factory=dict)
    baseline_of: tuple[int, int] = (0, 0)  # ids of the (profile, frontier) it was computed for
    baseline: MaxClockBaseline | None = None
    changes: int = 0  # counted reports so far: the view is cached per value (and world size)
    view_of: tuple[int, int] = (-1, 0)
    view: dict[str, Any] | None = None


class MeasuredPower:
    """The measured power and energy saved of every job (one per service, made by its facade)."""

    def __init__(
        self, jobs: JobTable, withheld: Callable[[Job], str | None] = lambda job: None
    ) -> None:
        """Export the measured figures of the service's jobs.

        ``jobs``: the service's jobs (what it exports is of the jobs still there);
        ``withheld``: why a job's saved figures are withheld (None: they are not).
        """
        self.jobs = jobs
        self._jobs: dict[str, _JobEnergy] = {}
        self.withheld = withheld

    # --- ingestion -------------------------------------------------------------------------------

    def observe(self, checked: CheckedReport) -> None:
        """Count one accepted report (see the module docstring for which count)."""
        job, rank, rep = checked.job, checked.rank, checked.report
        energy, seconds = float(rep.energy), float(rep.iteration_time)
        if not (0 < energy <= MAX_ENERGY and MIN_SECONDS <= seconds <= MAX_SECONDS):
            return
        if job.profiling_is(ProfilingStatus.RUNNING):
            return
        je = self._jobs.get(job.id)
        if je is None:
            self._prune()
            je = self._jobs[job.id] = _JobEnergy()
        r = je.ranks.get(rank.rank_id)
        if r is None:
            r = je.ranks[rank.rank_id] = _RankEnergy()
            je.changes += 1
        version = int(rep.plan_version)
        fresh = version != r.version
        total_e = energy + (0.0 if fresh else r.energy)
        total_t = seconds + (0.0 if fresh else r.time)
        if not _all_finite(total_e, total_t, total_e / total_t):
            return  # a report that would overflow the sums is not counted (module docstring)
        base = self._baseline(job, je)
        counts = base is not None and 0 <= rank.pipeline_rank < len(base.compute)
        if counts:
            assert base is not None
            measured = r.measured + energy
            max_clock = r.max_clock + base.energy(rank.pipeline_rank, seconds)
            if not _all_finite(measured, max_clock, max_clock - measured):
                return
        if fresh:
            r.version, r.reports = version, 0
        r.energy, r.time = total_e, total_t
        r.reports += 1
        je.changes += 1
        if counts:
            r.measured, r.max_clock = measured, max_clock
            r.counted += 1

    def forget(self, job_id: str) -> None:
        """The job was deleted: its account goes."""
        self._jobs.pop(job_id, None)

    def _baseline(self, job: Job, je: _JobEnergy) -> MaxClockBaseline | None:
        profile, frontier = job.profile.current, job.frontier.current
        if profile is None or frontier is None:
            return None
        key = (id(profile), id(frontier))
        if je.baseline_of != key:
            je.baseline_of, je.baseline = key, max_clock_baseline(profile, frontier)
        return je.baseline

    def _prune(self) -> None:
        for job_id in [j for j in self._jobs if j not in self.jobs]:
            del self._jobs[job_id]

    # --- views -----------------------------------------------------------------------------------

    def view(self, job: Job) -> dict[str, Any] | None:
        """``GET /jobs/{id}/status``'s ``measured``; None until the job reported energy."""
        je = self._jobs.get(job.id)
        if je is None or not je.ranks:
            return None
        world = job.spec.world_size
        if je.view is None or je.view_of != (je.changes, world):
            je.view_of, je.view = (je.changes, world), _sums(je.ranks.values(), world)
        v = je.view
        doc = {k: v[k] for k in ("average_power", "plan_version", "power_ranks")}
        doc["power_iterations"], doc["energy"] = v["power_iterations"], v["energy"]
        withheld = self.withheld(job)
        if withheld is not None:
            doc.update(max_clock_energy=None, energy_saved=None, withheld=withheld)
        else:
            max_clock = v["max_clock_energy"]
            doc.update(max_clock_energy=max_clock, energy_saved=max_clock - v["energy"])
        doc["iterations"], doc["ranks"] = v["iterations"], v["ranks"]
        return doc

    def _views(self) -> dict[str, dict[str, Any]]:
        self._prune()
        out = {}
        for job_id in self._jobs:
            v = self.view(self.jobs.get(job_id))
            if v is not None:
                out[job_id] = v
        return out

    def powers(self) -> dict[Labels, float]:
        """``perseus_job_power_watts`` by job."""
        return {
            (("perseus_job", j),): float(v["average_power"])
            for j, v in self._views().items()
            if v["average_power"] is not None
        }

    def savings(self) -> dict[Labels, float]:
        """``perseus_energy_saved_joules`` by job.

        Jobs with a max-clock baseline whose figures are not withheld.
        """
        return {
            (("perseus_job", j),): float(v["energy_saved"])
            for j, v in self._views().items()
            if v["ranks"] and v["energy_saved"] is not None and math.isfinite(v["energy_saved"])
        }


def _sums(ranks: Iterable[_RankEnergy], world: int) -> dict[str, Any]:
    """The view's figures over the ranks' sums, in one pass.

    ``max_clock_energy`` comes before the withholding is decided.
    """
    newest, power_sum, power_ranks, power_iterations = -1, 0.0, 0, 0
    counted, measured, max_clock, iterations = 0, 0.0, 0.0, 0
    for r in ranks:
        if r.version > newest:  # a newer version: the power sums start again
            newest, power_sum, power_ranks, power_iterations = r.version, 0.0, 0, 0
        if r.version == newest and r.time > 0:
            power_sum += r.energy / r.time
            power_iterations = r.reports if not power_ranks else min(power_iterations, r.reports)
            power_ranks += 1
        if r.counted:
            counted += 1
            measured += r.measured
            max_clock += r.max_clock
            iterations = max(iterations, r.counted)
    scale = world / counted if counted else 0.0
    return {
        "average_power": _finite(world / power_ranks * power_sum) if power_ranks else None,
        "plan_version": newest,
        "power_ranks": power_ranks,
        "power_iterations": power_iterations,
        "energy": scale * measured,
        "max_clock_energy": scale * max_clock,
        "iterations": iterations,
        "ranks": counted,
    }


def _all_finite(*xs: float) -> bool:
    return all(math.isfinite(x) for x in xs)


def _finite(x: float | None) -> float | None:
    """``x`` when it is a finite number, else None (JSON has no infinities or NaN)."""
    return x if x is not None and math.isfinite(x) else None
