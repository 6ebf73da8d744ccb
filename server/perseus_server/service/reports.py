"""Iteration reports from the ranks: validated (a batch is taken whole or not at all), stored,
and fed to online profiling or to the straggler and slow-stage detectors.

A large report arrives as :class:`~perseus_server.domain.values.InstructionColumns`; its
measurements are then checked with array operations (:func:`validate_report`), with the same
results and errors as one measurement at a time, and measured per stage as every report is
(:func:`~perseus_server.service.slow_stages.stage_factors`).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perseus.profiles import INSTRUCTION_KINDS, Profile
from perseus_common.profile_csv import MAX_FREQUENCY_MHZ
from perseus_server.config import Limits
from perseus_server.decisions.profiling_scan import Measurement
from perseus_server.domain.bounds import (
    MAX_ENERGY,
    MAX_INSTRUCTION_SECONDS,
    MAX_SECONDS,
    MAX_TRANSFER_SECONDS,
    MIN_SECONDS,
    MIN_TRANSFER_SECONDS,
    TRANSFER_DIRECTIONS,
    bounded_factor,
    check_energy,
    check_seconds,
)
from perseus_server.domain.errors import BadRequest, Conflict
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import ProfilingStatus
from perseus_server.domain.values import InstructionColumns, InstructionReport, IterationReport
from perseus_server.service.clock_verification import ClockVerification, validate_applied_clocks
from perseus_server.service.context import ServiceContext
from perseus_server.service.measured_power import MeasuredPower
from perseus_server.service.online_profiling import OnlineProfiling
from perseus_server.service.slow_links import SlowLinks, combined_link_times
from perseus_server.service.slow_stages import SlowStageResolver, stage_factors
from perseus_server.service.state import Job, JobTable
from perseus_server.service.stragglers import Stragglers

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


def _factors(job: Job, rank: RankInfo, rep: IterationReport) -> dict[int, float] | None:
    """The report's per-stage factors, each within :func:`bounded_factor`'s bounds; None for
    an iteration that ran off-plan (some instruction more than a clock step below its locked
    clock): its slowness is its clocks', which the off-plan straggler path of
    :mod:`perseus_server.decisions.detectors` acts on, not its stages' pace at their locked
    clocks (counting it in both made which path fired first a race)."""
    if rep.off_plan:
        return None
    factors = stage_factors(job, rank, rep.instructions)
    return None if factors is None else {s: bounded_factor(f) for s, f in factors.items()}


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


@dataclass(frozen=True)
class CheckedReport:
    """A validated report with its job, rank and (computed ahead) per-stage factors."""

    index: int
    job: Job
    rank: RankInfo
    report: IterationReport
    profile: Profile | None
    factors: dict[int, float] | None
    #: The measurements as online profiling takes them, made ahead when the job was profiling
    #: at the check (None: make them when recording, if it is).
    measurements: list[Measurement] | None = None


class Reports:
    """``ReportIterations``."""

    def __init__(
        self,
        ctx: ServiceContext,
        stragglers: Stragglers,
        slow_stages: SlowStageResolver,
        profiling: OnlineProfiling,
        measured: MeasuredPower,
    ) -> None:
        self.ctx = ctx
        self.stragglers = stragglers
        self.slow_stages = slow_stages
        self.profiling = profiling
        self.clocks = ClockVerification(ctx.metrics.off_plan_instructions)
        self.measured = measured
        self.slow_links = SlowLinks(ctx, slow_stages, stragglers)

    def check(self, i: int, rep: IterationReport) -> CheckedReport:
        """Validate report ``i`` of a batch and measure its stages (linear in its length, no
        change to the state: large reports run this off the event loop)."""
        job, rank = _reporter(self.ctx.jobs, i, rep)
        validate_report(i, rep, job, self.ctx.limits)
        profile = job.profile.current
        factors = _factors(job, rank, rep) if rep.instructions else None
        ms = measurements(rep) if job.profiling_is(ProfilingStatus.RUNNING) else None
        return CheckedReport(i, job, rank, rep, profile, factors, ms)

    def record(self, reports: Sequence[IterationReport]) -> int:
        """Validate and store a batch of iteration reports (all or nothing); returns how many."""
        return self.record_checked([self.check(i, rep) for i, rep in enumerate(reports)])

    def record_checked(self, batch: Sequence[CheckedReport]) -> int:
        """Store reports :meth:`check` accepted (all or nothing); returns how many were
        acknowledged (re-sent ones included: see :meth:`record_counted`)."""
        return sum(self.record_counted(batch))

    def record_counted(self, batch: Sequence[CheckedReport]) -> tuple[int, int]:
        """Store reports :meth:`check` accepted; returns (new, duplicates).

        A report whose ``sequence`` is not above the last one accepted from the same rank *and
        client incarnation* is a re-sent one: acknowledged, counted as a duplicate, and dropped
        (never stored, never measured twice by online profiling or the detectors). A restarted
        client picks a new incarnation, so its reports are never compared with the sequences of
        its previous run (a clock set back, a sequence of 2^63-1); the last sequences of the
        :data:`INCARNATIONS_KEPT` most recently reporting incarnations of a rank are kept.
        """
        if not batch:
            return 0, 0
        ctx = self.ctx
        rows_by_job: dict[str, list[tuple[str, int, float, float, int]]] = {}
        seqs_by_job: dict[str, dict[tuple[str, int], int]] = {}
        checked: list[tuple[Job, RankInfo, IterationReport, CheckedReport]] = []
        duplicates = 0
        for c in batch:
            if c.job.id not in ctx.jobs or ctx.jobs.get(c.job.id) is not c.job:
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
                    duplicates += 1
                    continue
                seqs[key] = rep.sequence
            checked.append((job, rank, rep, c))
            rows_by_job.setdefault(job.id, []).append(
                (
                    rank.rank_id,
                    int(rep.iteration),
                    float(rep.iteration_time),
                    float(rep.energy),
                    int(rep.plan_version),
                )
            )
        for job_id, rows in rows_by_job.items():
            job_seqs = seqs_by_job.get(job_id)
            ctx.store.add_iterations(
                job_id, rows, ctx.limits.history_per_rank, job_seqs, INCARNATIONS_KEPT
            )
            if job_seqs:
                _remember(ctx.jobs.get(job_id).ranks.last_sequence, job_seqs)
        if duplicates:
            ctx.metrics.duplicate_reports.inc(duplicates)
        touched: set[str] = set()
        for job, rank, rep, c in checked:
            self._account(job, rank, rep)
            self.clocks.observe(job, rank, rep)
            self.measured.observe(job, rank, rep)
            if job.profiling_is(ProfilingStatus.RUNNING):
                assert job.profiling is not None
                ms = c.measurements if c.measurements is not None else measurements(rep)
                # Every report counts, the client's warm-up iterations (which carry no
                # measurements) included: the warm-up is counted once, here.
                job.profiling.record(
                    rank.rank_id,
                    int(rep.plan_version),
                    float(rep.energy),
                    ms,
                    iteration_time=float(rep.iteration_time),
                    transfers=dict(combined_link_times(job, rank, rep)) if rep.transfers else None,
                )
                if ms:
                    touched.add(job.id)
            else:
                self.stragglers.observe(job, rank, float(rep.iteration_time), int(rep.plan_version))
                if rep.transfers:
                    self.slow_links.observe(job, rank, rep)
                # A job whose profile does not describe it has its slow-stage replans paused too.
                if rep.instructions and self.stragglers.checks.reason(job) is None:
                    if c.profile is job.profile.current:
                        if c.factors is not None:
                            self.slow_stages.apply(job, rank, c.factors)
                    else:  # the profile changed since the check: measure again
                        factors = _factors(job, rank, rep)
                        if factors is not None:
                            self.slow_stages.apply(job, rank, factors)
        for job_id in touched:
            if job_id in ctx.jobs:
                self.profiling.tick(ctx.jobs.get(job_id))
        ctx.metrics.reports.inc(len(checked))
        return len(checked), duplicates

    @staticmethod
    def _account(job: Job, rank: RankInfo, rep: IterationReport) -> None:
        """The rank's recent iterations, and its pipeline's iteration time (its slowest rank)."""
        ranks = job.ranks
        ranks.history.setdefault(rank.rank_id, deque(maxlen=32)).append(
            (
                int(rep.iteration),
                float(rep.iteration_time),
                float(rep.energy),
                int(rep.plan_version),
            )
        )
        times = ranks.pipeline_times.setdefault(rank.data_rank, OrderedDict())
        it = int(rep.iteration)
        times[it] = max(times.get(it, 0.0), float(rep.iteration_time))
        while len(times) > 64:
            times.popitem(last=False)
