"""Iteration reports from the ranks: validated, stored once, then handed to the observers.

A batch is taken whole or not at all. Each report is stored once, then handed to the ordered list of
observers the service gives at construction
(:class:`~perseus_server.service.observers.ReportObserver`: the ranks' history, clock verification,
measured power, stragglers, slow links, slow stages, online profiling). The checks before anything
is stored are :mod:`perseus_server.service.report_checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perseus_common.wire.values import IterationReport
from perseus_server.service.context import ServiceContext
from perseus_server.service.observers import ReportObserver
from perseus_server.service.report_checks import CheckedReport, check_report

__all__ = ["INCARNATIONS_KEPT", "PreparedReports", "Reports"]

#: Client incarnations whose last sequence is kept per rank (the most recently reporting ones).
INCARNATIONS_KEPT = 8


def _remember(last: dict[str, dict[int, int]], seqs: dict[tuple[str, int], int]) -> None:
    """Record accepted sequences, keeping each rank's most recent incarnations.

    Each (rank, incarnation) moves to its rank's most recent end, and a rank keeps its
    :data:`INCARNATIONS_KEPT` most recent incarnations (as the store).
    """
    for (rank_id, incarnation), seq in seqs.items():
        per_rank = last.setdefault(rank_id, {})
        per_rank[incarnation] = max(seq, per_rank.pop(incarnation, 0))
        while len(per_rank) > INCARNATIONS_KEPT:
            del per_rank[next(iter(per_rank))]


@dataclass(frozen=True)
class PreparedReports:
    """A batch of checked reports ready to store.

    The new ones, the sequences they bring per job and (rank, incarnation), and per report of
    the batch whether it is new (False: re-sent).
    """

    accepted: list[CheckedReport]
    seqs_by_job: dict[str, dict[tuple[str, int], int]]
    new: list[bool]


class Reports:
    """``ReportIterations``: validate, store once, hand to the observers in order."""

    def __init__(self, ctx: ServiceContext, observers: Sequence[ReportObserver]) -> None:
        """``observers``: who takes each accepted report, in this order."""
        self.ctx = ctx
        self.observers = tuple(observers)

    def check(self, i: int, rep: IterationReport) -> CheckedReport:
        """Check report ``i`` against this service's jobs and limits.

        See :func:`~perseus_server.service.report_checks.check_report`.
        """
        return check_report(self.ctx.jobs, self.ctx.limits, i, rep)

    def record(self, reports: Sequence[IterationReport]) -> int:
        """Validate and store a batch of iteration reports (all or nothing).

        Returns how many were acknowledged (re-sent ones included: see
        :meth:`record_counted`).
        """
        return sum(self.record_counted([self.check(i, rep) for i, rep in enumerate(reports)]))

    def record_counted(self, batch: Sequence[CheckedReport]) -> tuple[int, int]:
        """Store reports :meth:`check` accepted, then hand each new one to every observer in order.

        Returns (new, duplicates).

        A report whose ``sequence`` is not above the last one accepted from the same rank *and
        client incarnation* is a re-sent one: acknowledged, counted as a duplicate, and dropped
        (never stored, never observed twice). A restarted client picks a new incarnation, so
        its reports are never compared with the sequences of its previous run (a clock set
        back, a sequence of 2^63-1); the last sequences of the :data:`INCARNATIONS_KEPT` most
        recently reporting incarnations of a rank are kept.
        """
        prepared = self.prepare(batch)
        self.write(prepared)
        return self.apply(prepared)

    def prepare(self, batch: Sequence[CheckedReport]) -> PreparedReports:
        """The first step of :meth:`record_counted`: the batch's new reports and their sequences.

        No store call: the second step, :meth:`write`, may run on another thread, and
        :meth:`apply` follows once it committed.
        """
        return PreparedReports(*self._admit(batch))

    def write(self, prepared: PreparedReports) -> None:
        """Store the accepted reports' iterations and sequences, per job in one call.

        One transaction per job unless the caller holds one; touches nothing but the store.
        """
        rows_by_job: dict[str, list[tuple[str, int, float, float, int]]] = {}
        for c in prepared.accepted:
            rep = c.report
            rows_by_job.setdefault(c.job.id, []).append(
                (
                    c.rank.rank_id,
                    int(rep.iteration),
                    float(rep.iteration_time),
                    float(rep.energy),
                    int(rep.plan_version),
                )
            )
        ctx = self.ctx
        for job_id, rows in rows_by_job.items():
            ctx.store.add_iterations(
                job_id,
                rows,
                ctx.limits.history_per_rank,
                prepared.seqs_by_job.get(job_id),
                INCARNATIONS_KEPT,
            )

    def apply(self, prepared: PreparedReports) -> tuple[int, int]:
        """Once stored: remember the sequences and hand each new report to every observer in order.

        Returns (new, duplicates). A job deleted or replaced since :meth:`prepare` is
        skipped.
        """
        jobs = self.ctx.jobs
        live = {
            c.job.id for c in prepared.accepted if c.job.id in jobs and jobs.get(c.job.id) is c.job
        }
        for job_id, job_seqs in prepared.seqs_by_job.items():
            if job_seqs and job_id in live:
                _remember(jobs.get(job_id).ranks.last_sequence, job_seqs)
        accepted = [c for c in prepared.accepted if c.job.id in live]
        duplicates = len(prepared.new) - len(prepared.accepted)
        if duplicates:
            self.ctx.metrics.duplicate_reports.inc(duplicates)
        for c in accepted:
            for observer in self.observers:
                observer.observe(c)
        self.ctx.metrics.reports.inc(len(prepared.accepted))
        return len(prepared.accepted), duplicates

    def forget(self, job_id: str) -> None:
        """The job was deleted: every observer forgets it."""
        for observer in self.observers:
            observer.forget(job_id)

    def _admit(
        self, batch: Sequence[CheckedReport]
    ) -> tuple[list[CheckedReport], dict[str, dict[tuple[str, int], int]], list[bool]]:
        """The batch's new reports, the sequences they bring, and whether each report is new.

        The reports are checked again if their job changed meanwhile, and a rank's reported
        clock control is recorded (re-sent reports' too). The sequences are per job and (rank,
        incarnation); whether it is new is per report.
        """
        accepted: list[CheckedReport] = []
        new: list[bool] = []
        seqs_by_job: dict[str, dict[tuple[str, int], int]] = {}
        for c in batch:
            if c.job.id not in self.ctx.jobs or self.ctx.jobs.get(c.job.id) is not c.job:
                c = self.check(c.index, c.report)  # the job changed meanwhile: check again
            job, rank, rep = c.job, c.rank, c.report
            if rep.clock_control:
                job.ranks.clock_control[rank.rank_id] = (
                    rep.clock_control,
                    rep.clock_control_reason,
                )
            if rep.power_floor:
                job.ranks.power_floor[rank.rank_id] = (
                    rep.power_floor,
                    rep.power_floor_reason,
                    rep.power_floor_swing,
                )
            if rep.sequence > 0:
                seqs = seqs_by_job.setdefault(job.id, {})
                key = (rank.rank_id, int(rep.incarnation))
                last = seqs.get(key)
                if last is None:
                    last = job.ranks.last_sequence.get(rank.rank_id, {}).get(key[1], 0)
                if rep.sequence <= last:
                    new.append(False)
                    continue
                seqs[key] = rep.sequence
            new.append(True)
            accepted.append(c)
        return accepted, seqs_by_job, new
