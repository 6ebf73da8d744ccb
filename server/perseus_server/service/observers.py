"""What an accepted iteration report is handed to.

The :class:`ReportObserver` protocol (each receives the
:class:`~perseus_server.service.report_checks.CheckedReport`), and the first observer, the ranks'
recent iterations (:class:`RankHistory`).

:class:`~perseus_server.service.reports.Reports` validates and stores a report, then hands it to
the ordered list of observers the service gives it at construction
(:class:`~perseus_server.service.facade.PerseusService`): the ranks' history, applied-clock
verification, measured power, stragglers, slow links, slow stages, online profiling. An observer
decides for itself whether a report concerns it (the detectors stand aside while a job is being
profiled; online profiling takes reports only then). A new detector is one new observer and its
place in that list (a job's lifecycle is not one: it follows the ranks' plan streams, see
:mod:`perseus_server.service.lifecycle`). One contract suite
(``tests/server/service/test_observers.py``) runs over every observer the service registers.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Protocol

from perseus_server.service.report_checks import CheckedReport

__all__ = ["RankHistory", "ReportObserver"]

#: Iterations of a rank kept for its status (``recent_iterations``).
HISTORY_PER_RANK = 32
#: Iterations of a pipeline whose time (its slowest rank's) is kept.
PIPELINE_ITERATIONS = 64


class ReportObserver(Protocol):
    """A part of the service that takes every accepted (validated, stored, not re-sent) report."""

    def observe(self, checked: CheckedReport) -> None:
        """One accepted report; raises nothing a rank caused (the report is stored already)."""
        ...

    def forget(self, job_id: str) -> None:
        """The job was deleted: keep nothing of it (a state kept on the job goes with it)."""
        ...


class RankHistory:
    """Each rank's recent iterations, and each pipeline's iteration time (its slowest rank's).

    Kept on the job (``job.ranks``), which the status and the profile checks read.
    """

    def observe(self, checked: CheckedReport) -> None:
        """Add the iteration to its rank's history; raise its pipeline's iteration time."""
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
