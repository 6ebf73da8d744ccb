"""Iteration reports from the ranks: validated (a batch is taken whole or not at all), stored
once, then handed to the ordered list of observers the service gives at construction
(:class:`~perseus_server.service.observers.ReportObserver`: the ranks' history, clock
verification, measured power, stragglers, slow links, slow stages, online profiling).

A large report arrives as :class:`~perseus_server.domain.values.InstructionColumns`; its
measurements are then checked with array operations (:func:`validate_report`), with the same
results and errors as one measurement at a time, and measured per stage as every report is
(:func:`~perseus_server.service.slow_stages.checked_stage_factors`), off the event loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perseus.profiles import INSTRUCTION_KINDS
from perseus_common.profile_csv import MAX_FREQUENCY_MHZ
from perseus_server.config import Limits
from perseus_server.domain.bounds import (
    MAX_ENERGY,
    MAX_INSTRUCTION_SECONDS,
    MAX_SECONDS,
    MAX_TRANSFER_SECONDS,
    MIN_SECONDS,
    MIN_TRANSFER_SECONDS,
    TRANSFER_DIRECTIONS,
    check_energy,
    check_seconds,
)
from perseus_server.domain.errors import BadRequest, Conflict
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import ProfilingStatus
from perseus_server.domain.values import InstructionColumns, InstructionReport, IterationReport
from perseus_server.service.clock_verification import validate_applied_clocks
from perseus_server.service.context import ServiceContext
from perseus_server.service.observers import CheckedReport, ReportObserver, measurements
from perseus_server.service.slow_stages import checked_stage_factors
from perseus_server.service.state import Job, JobTable

__all__ = [
    "CLOCK_CONTROL_STATES",
    "INCARNATIONS_KEPT",
    "CheckedReport",
    "Reports",
    "first_bad_instruction",
    "measurements",
    "validate_clock_control",
    "validate_report",
]

#: The clock-control states a rank may report ("": it does not say).
CLOCK_CONTROL_STATES = ("", "active", "unavailable")
#: Characters of a clock-control reason accepted.
MAX_CLOCK_CONTROL_REASON = 256
#: Client incarnations whose last sequence is kept per rank (the most recently reporting ones).
INCARNATIONS_KEPT = 8


def validate_clock_control(where: str, state: str, reason: str) -> None:
    """Raise :class:`BadRequest` naming the field when a reported clock control is malformed."""
    if state not in CLOCK_CONTROL_STATES:
        raise BadRequest(
            f"{where}: unknown clock-control state (one of active, unavailable)",
            field="clock_control.state",
        )
    if len(reason) > MAX_CLOCK_CONTROL_REASON:
        raise BadRequest(
            f"{where}: at most {MAX_CLOCK_CONTROL_REASON} characters, got {len(reason)}",
            field="clock_control.reason",
        )


def validate_report(i: int, rep: IterationReport, job: Job, limits: Limits) -> None:
    """Raise :class:`BadRequest` naming the field when report ``i`` of a batch is malformed."""
    check_seconds(rep.iteration_time, "iteration_time", f"report {i}: ", MIN_SECONDS, MAX_SECONDS)
    check_energy(rep.energy, "energy", f"report {i}: ")
    if rep.sequence < 0:
        raise BadRequest(f"report {i}: must be >= 0, got {rep.sequence}", field="sequence")
    if rep.incarnation < 0:
        raise BadRequest(f"report {i}: must be >= 0, got {rep.incarnation}", field="incarnation")
    validate_clock_control(f"report {i}", rep.clock_control, rep.clock_control_reason)
    if rep.iteration < 0:
        raise BadRequest(f"report {i}: must be >= 0, got {rep.iteration}", field="iteration")
    if len(rep.instructions) > limits.max_report_instructions:
        raise BadRequest(
            f"report {i}: at most {limits.max_report_instructions} measurements",
            field="instructions",
        )
    stages, microbatches = job.schedule.stages, job.spec.microbatches
    if isinstance(rep.instructions, InstructionColumns):
        j = first_bad_instruction(rep.instructions, stages, microbatches)
        if j is not None:
            _check_instruction(f"report {i} instructions[{j}]", rep.instructions[j], job)
            raise AssertionError(f"instructions[{j}] passed its check")  # pragma: no cover
    else:
        for j, m in enumerate(rep.instructions):
            _check_instruction(f"report {i} instructions[{j}]", m, job)
    validate_applied_clocks(i, rep, job, limits)
    if rep.transfers:
        _check_transfers(i, rep, job, limits)


def _check_transfers(i: int, rep: IterationReport, job: Job, limits: Limits) -> None:
    """The report's timed transfers: at most as many as measurements, each on a boundary of the
    job's model (``0 <= boundary < stages - 1``), a known direction, a microbatch of the job, a
    time within :mod:`perseus_server.domain.bounds`."""
    if len(rep.transfers) > limits.max_report_instructions:
        raise BadRequest(
            f"report {i}: at most {limits.max_report_instructions} transfers", field="transfers"
        )
    boundaries, microbatches = job.schedule.stages - 1, job.spec.microbatches
    for j, t in enumerate(rep.transfers):
        where = f"report {i} transfers[{j}]: "
        if not 0 <= t.boundary < boundaries:
            raise BadRequest(
                f"{where}boundary must be between 0 and {boundaries - 1} (the boundary between "
                f"stage b and b + 1 of {job.schedule.stages} stages), got {t.boundary}",
                field="transfers.boundary",
            )
        if t.direction not in TRANSFER_DIRECTIONS:
            raise BadRequest(
                f"{where}unknown direction {t.direction[:32]!r} (forward or backward)",
                field="transfers.direction",
            )
        if not 0 <= t.microbatch < microbatches:
            raise BadRequest(
                f"{where}microbatch must be between 0 and {microbatches - 1}, got {t.microbatch}",
                field="transfers.microbatch",
            )
        check_seconds(t.time, "transfers.time", where, MIN_TRANSFER_SECONDS, MAX_TRANSFER_SECONDS)


def _check_instruction(where: str, m: InstructionReport, job: Job) -> None:
    if m.instruction not in INSTRUCTION_KINDS:
        raise BadRequest(
            f"{where}: unknown instruction {m.instruction!r}",
            field="instructions.instruction",
        )
    if not (math.isfinite(m.time) and 0 < m.time <= MAX_INSTRUCTION_SECONDS):
        raise BadRequest(
            f"{where}: time must be a positive number of seconds up to "
            f"{MAX_INSTRUCTION_SECONDS:g}, got {m.time!r}",
            field="instructions.time",
        )
    if not (math.isfinite(m.energy) and 0 <= m.energy <= MAX_ENERGY):
        raise BadRequest(
            f"{where}: energy must be finite, >= 0 and at most {MAX_ENERGY:g} J, got {m.energy!r}",
            field="instructions.energy",
        )
    if not (0 <= m.stage < job.schedule.stages) or not (0 <= m.microbatch < job.spec.microbatches):
        raise BadRequest(f"{where}: stage or microbatch out of range", field="instructions.stage")
    if not 0 <= m.frequency_mhz <= MAX_FREQUENCY_MHZ:
        raise BadRequest(
            f"{where}: frequency must be between 0 and {MAX_FREQUENCY_MHZ} MHz",
            field="instructions.frequency_mhz",
        )


def first_bad_instruction(cols: InstructionColumns, stages: int, microbatches: int) -> int | None:
    """The index of the first measurement :func:`validate_report` refuses (None: all pass).

    The same predicates as the one-at-a-time check, as array operations (``O(n)``).
    """
    known = np.array([k in INSTRUCTION_KINDS for k in cols.kinds] + [False], dtype=bool)
    with np.errstate(invalid="ignore"):
        ok = known[cols.kind]
        ok &= np.isfinite(cols.time) & (cols.time > 0) & (cols.time <= MAX_INSTRUCTION_SECONDS)
        ok &= np.isfinite(cols.energy) & (cols.energy >= 0) & (cols.energy <= MAX_ENERGY)
    ok &= (cols.stage >= 0) & (cols.stage < stages)
    ok &= (cols.microbatch >= 0) & (cols.microbatch < microbatches)
    ok &= (cols.frequency_mhz >= 0) & (cols.frequency_mhz <= MAX_FREQUENCY_MHZ)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else None


def _remember(last: dict[str, dict[int, int]], seqs: dict[tuple[str, int], int]) -> None:
    """Record accepted sequences: each (rank, incarnation) moves to its rank's most recent end,
    and a rank keeps its :data:`INCARNATIONS_KEPT` most recent incarnations (as the store)."""
    for (rank_id, incarnation), seq in seqs.items():
        per_rank = last.setdefault(rank_id, {})
        per_rank[incarnation] = max(seq, per_rank.pop(incarnation, 0))
        while len(per_rank) > INCARNATIONS_KEPT:
            del per_rank[next(iter(per_rank))]


def _reporter(jobs: JobTable, i: int, rep: IterationReport) -> tuple[Job, RankInfo]:
    job = jobs.get(rep.job_id)
    rank = job.ranks.by_id.get(rep.rank_id)
    if rank is None:
        raise Conflict(
            f"report {i}: rank {rep.rank_id!r} is not registered in job {rep.job_id}",
            field="rank_id",
        )
    return job, rank


class Reports:
    """``ReportIterations``: validate, store once, hand to the observers in order."""

    def __init__(self, ctx: ServiceContext, observers: Sequence[ReportObserver]) -> None:
        """``observers``: who takes each accepted report, in this order."""
        self.ctx = ctx
        self.observers = tuple(observers)

    def check(self, i: int, rep: IterationReport) -> CheckedReport:
        """Validate report ``i`` of a batch and measure its stages (linear in its length, no
        change to the state: large reports run this off the event loop)."""
        job, rank = _reporter(self.ctx.jobs, i, rep)
        validate_report(i, rep, job, self.ctx.limits)
        profile = job.profile.current
        factors = checked_stage_factors(job, rank, rep) if rep.instructions else None
        ms = measurements(rep) if job.profiling_is(ProfilingStatus.RUNNING) else None
        return CheckedReport(i, job, rank, rep, profile, factors, ms)

    def record(self, reports: Sequence[IterationReport]) -> int:
        """Validate and store a batch of iteration reports (all or nothing); returns how many
        were acknowledged (re-sent ones included: see :meth:`record_counted`)."""
        return sum(self.record_counted([self.check(i, rep) for i, rep in enumerate(reports)]))

    def record_counted(self, batch: Sequence[CheckedReport]) -> tuple[int, int]:
        """Store reports :meth:`check` accepted, then hand each new one to every observer in
        order; returns (new, duplicates).

        A report whose ``sequence`` is not above the last one accepted from the same rank *and
        client incarnation* is a re-sent one: acknowledged, counted as a duplicate, and dropped
        (never stored, never observed twice). A restarted client picks a new incarnation, so
        its reports are never compared with the sequences of its previous run (a clock set
        back, a sequence of 2^63-1); the last sequences of the :data:`INCARNATIONS_KEPT` most
        recently reporting incarnations of a rank are kept.
        """
        accepted, seqs = self._admit(batch)
        self._store(accepted, seqs)
        if len(accepted) < len(batch):
            self.ctx.metrics.duplicate_reports.inc(len(batch) - len(accepted))
        for c in accepted:
            for observer in self.observers:
                observer.observe(c)
        self.ctx.metrics.reports.inc(len(accepted))
        return len(accepted), len(batch) - len(accepted)

    def forget(self, job_id: str) -> None:
        """The job was deleted: every observer forgets it."""
        for observer in self.observers:
            observer.forget(job_id)

    def _admit(
        self, batch: Sequence[CheckedReport]
    ) -> tuple[list[CheckedReport], dict[str, dict[tuple[str, int], int]]]:
        """The batch's new reports (checked again if their job changed meanwhile; a rank's
        reported clock control recorded, re-sent ones too), and the sequences they bring per
        job and (rank, incarnation)."""
        accepted: list[CheckedReport] = []
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
            if rep.sequence > 0:
                seqs = seqs_by_job.setdefault(job.id, {})
                key = (rank.rank_id, int(rep.incarnation))
                last = seqs.get(key)
                if last is None:
                    last = job.ranks.last_sequence.get(rank.rank_id, {}).get(key[1], 0)
                if rep.sequence <= last:
                    continue
                seqs[key] = rep.sequence
            accepted.append(c)
        return accepted, seqs_by_job

    def _store(
        self, accepted: Sequence[CheckedReport], seqs_by_job: dict[str, dict[tuple[str, int], int]]
    ) -> None:
        """Store the accepted reports' iterations and sequences, per job in one call."""
        rows_by_job: dict[str, list[tuple[str, int, float, float, int]]] = {}
        for c in accepted:
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
            job_seqs = seqs_by_job.get(job_id)
            ctx.store.add_iterations(
                job_id, rows, ctx.limits.history_per_rank, job_seqs, INCARNATIONS_KEPT
            )
            if job_seqs:
                _remember(ctx.jobs.get(job_id).ranks.last_sequence, job_seqs)
