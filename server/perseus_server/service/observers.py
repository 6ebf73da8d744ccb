"""What an accepted iteration report is handed to: the :class:`ReportObserver` protocol, the
value each observer receives (:class:`CheckedReport`), and the first observer, the ranks'
recent iterations (:class:`RankHistory`).

:class:`~perseus_server.service.reports.Reports` validates and stores a report, then hands it to
the ordered list of observers the service gives it at construction
(:class:`~perseus_server.service.facade.PerseusService`): the ranks' history, applied-clock
verification, measured power, stragglers, slow links, slow stages, online profiling. An observer
decides for itself whether a report concerns it (the detectors stand aside while a job is being
profiled; online profiling takes reports only then). A new detector is one new observer and its
place in that list; one contract suite (``tests/server/test_report_observers.py``) runs over
every observer the service registers.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Protocol

from perseus.profiles import Profile
from perseus_server.decisions.profiling_scan import Measurement
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.values import InstructionColumns, IterationReport
from perseus_server.service.state import Job

__all__ = ["CheckedReport", "RankHistory", "ReportObserver", "measurements"]

#: Iterations of a rank kept for its status (``recent_iterations``).
HISTORY_PER_RANK = 32
#: Iterations of a pipeline whose time (its slowest rank's) is kept.
PIPELINE_ITERATIONS = 64


def measurements(rep: IterationReport) -> list[Measurement]:
    """The report's measurements as online profiling takes them."""
    ins = rep.instructions
    if isinstance(ins, InstructionColumns):
        return list(
            map(
                Measurement,
                ins.names(),
                ins.stage.tolist(),
                ins.frequency_mhz.tolist(),
                ins.time.tolist(),
                ins.energy.tolist(),
            )
        )
    return [Measurement(m.instruction, m.stage, m.frequency_mhz, m.time, m.energy) for m in ins]


@dataclass(frozen=True)
class CheckedReport:
    """A validated report with its job, rank and what was measured of it ahead (off the event
    loop for a large report): the per-stage factors and online profiling's measurements."""

    index: int
    job: Job
    rank: RankInfo
    report: IterationReport
    #: The job's profile when the report was checked (the factors are against it).
    profile: Profile | None
    #: Per-stage slowdown factors (None: none to give, e.g. an off-plan iteration).
    factors: dict[int, float] | None
    #: The measurements as online profiling takes them, made ahead when the job was profiling
    #: at the check (None: made when observed, if it is).
    measurements: list[Measurement] | None = None


class ReportObserver(Protocol):
    """A part of the service that takes every accepted (validated, stored, not re-sent) report."""

    def observe(self, checked: CheckedReport) -> None:
        """One accepted report; raises nothing a rank caused (the report is stored already)."""
        ...

    def forget(self, job_id: str) -> None:
        """The job was deleted: keep nothing of it (a state kept on the job goes with it)."""
        ...


class RankHistory:
    """Each rank's recent iterations, and each pipeline's iteration time (its slowest rank's);
    kept on the job (``job.ranks``), which the status and the profile checks read."""

    def observe(self, checked: CheckedReport) -> None:
        rep, ranks = checked.report, checked.job.ranks
        it = int(rep.iteration)
        ranks.history.setdefault(checked.rank.rank_id, deque(maxlen=HISTORY_PER_RANK)).append(
            (it, float(rep.iteration_time), float(rep.energy), int(rep.plan_version))
        )
        times = ranks.pipeline_times.setdefault(checked.rank.data_rank, OrderedDict())
        times[it] = max(times.get(it, 0.0), float(rep.iteration_time))
        while len(times) > PIPELINE_ITERATIONS:
            times.popitem(last=False)

    def forget(self, job_id: str) -> None:
        """Nothing to do: the history is kept on the job."""
