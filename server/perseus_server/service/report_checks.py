"""Every check of an iteration report, before anything is stored.

Its reporter (a rank of the job), its fields (times, energies, sequence, clock control,
measurements, transfers, applied clocks; a bad one is refused naming the field), and what is
measured of it ahead, off the event loop for a large report (its per-stage slowdown factors, online
profiling's measurements). The product is the :class:`CheckedReport` the report pipeline stores and
hands to its observers (:mod:`perseus_server.service.reports`).

A large report arrives as :class:`~perseus_server.domain.instruction_columns.InstructionColumns`; its
measurements are then checked with array operations (:func:`first_bad_instruction`), with the
same results and errors as one measurement at a time, and measured per stage by array
operations too (:func:`report_stage_factors`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from perseus.profiles import INSTRUCTION_KINDS, Profile
from perseus_common.profile_csv import MAX_FREQUENCY_MHZ
from perseus_common.wire.values import InstructionReport, IterationReport
from perseus_server.config import Limits
from perseus_server.decisions.profiling_scan import Measurement
from perseus_server.decisions.report_statistics import stage_factors
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
from perseus_server.domain.instruction_columns import InstructionColumns
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import ProfilingStatus
from perseus_server.service.state import Job, JobTable

__all__ = [
    "CLOCK_CONTROL_STATES",
    "MAX_OFF_PLAN",
    "MAX_REASONS",
    "CheckedReport",
    "ReceivedReport",
    "check_before_decoding",
    "check_report",
    "checked_stage_factors",
    "first_bad_instruction",
    "measurements",
    "report_stage_factors",
    "validate_applied_clocks",
    "transfers_per_iteration",
    "validate_clock_control",
    "validate_report",
]

#: The clock-control states a rank may report ("": it does not say).
CLOCK_CONTROL_STATES = ("", "active", "unavailable")
#: Characters of a clock-control reason accepted.
MAX_CLOCK_CONTROL_REASON = 256
#: At most this many reason names per off-plan instruction or report.
MAX_REASONS = 32
#: At most this many off-plan instructions per report.
MAX_OFF_PLAN = 4096
_REASON = re.compile(r"[a-z0-9_]{1,64}")


class ReceivedReport(Protocol):
    """One report as it arrived (from the gRPC adapter), and how to decode it.

    Its job and rank, how many transfers it holds, its size in measurements, off-plan
    instructions and transfers, and how to decode it, or send its wire bytes to a decoding
    worker.
    """

    @property
    def job_id(self) -> str:
        """The job the report is for."""
        ...

    @property
    def rank_id(self) -> str:
        """The rank that sent it."""
        ...

    @property
    def transfers(self) -> int:
        """How many transfers it holds."""
        ...

    @property
    def size(self) -> int:
        """Its size: measurements, off-plan instructions and transfers."""
        ...

    def decode(self) -> IterationReport:
        """Decode it into an :class:`IterationReport`."""
        ...

    def wire(self) -> bytes:
        """Its wire bytes, for a decoding worker."""
        ...


@dataclass(frozen=True)
class CheckedReport:
    """A validated report with its job, rank and what was measured of it ahead.

    Measured ahead (off the event loop for a large report): the per-stage factors and online
    profiling's measurements.
    """

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


def check_report(jobs: JobTable, limits: Limits, i: int, rep: IterationReport) -> CheckedReport:
    """Validate report ``i`` of a batch and measure it.

    Linear in its length, no change to the state: a large report is checked off the event loop.
    """
    job, rank = _reporter(jobs, i, rep)
    validate_report(i, rep, job, limits, rank)
    profile = job.profile.current
    factors = checked_stage_factors(job, rank, rep) if rep.instructions else None
    ms = measurements(rep) if job.profiling_is(ProfilingStatus.RUNNING) else None
    return CheckedReport(i, job, rank, rep, profile, factors, ms)


def check_before_decoding(jobs: JobTable, job_id: str, rank_id: str, transfers: int) -> None:
    """What can be refused before a report is decoded (``O(1)``).

    Its job and rank, and more transfers than its rank makes in one iteration
    (:func:`transfers_per_iteration`), so a report of 100,000 transfers costs neither a decode
    nor memory.
    """
    job = jobs.get(job_id)
    _check_transfer_count(0, transfers, job, _reporter_rank(job, 0, rank_id))


def _reporter(jobs: JobTable, i: int, rep: IterationReport) -> tuple[Job, RankInfo]:
    job = jobs.get(rep.job_id)
    return job, _reporter_rank(job, i, rep.rank_id)


def _reporter_rank(job: Job, i: int, rank_id: str) -> RankInfo:
    rank = job.ranks.by_id.get(rank_id)
    if rank is None:
        raise Conflict(
            f"report {i}: rank {rank_id[:64]!r} is not registered in job {job.id}",
            field="rank_id",
        )
    return rank


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


def validate_power_floor(where: str, rep: IterationReport) -> None:
    """Raise :class:`BadRequest` naming the field when a reported power floor is malformed."""
    if rep.power_floor not in ("", "held", "unavailable"):
        raise BadRequest(
            f"{where}: unknown power-floor state (one of held, unavailable)",
            field="power_floor.state",
        )
    if len(rep.power_floor_reason) > MAX_CLOCK_CONTROL_REASON:
        raise BadRequest(
            f"{where}: at most {MAX_CLOCK_CONTROL_REASON} characters, got "
            f"{len(rep.power_floor_reason)}",
            field="power_floor.reason",
        )
    if not (math.isfinite(rep.power_floor_swing) and 0 <= rep.power_floor_swing <= 1):
        raise BadRequest(
            f"{where}: a swing is a number in [0, 1], got {rep.power_floor_swing!r}",
            field="power_floor.plan_swing",
        )


def validate_report(
    i: int, rep: IterationReport, job: Job, limits: Limits, rank: RankInfo | None = None
) -> None:
    """Raise :class:`BadRequest` naming the field when report ``i`` of a batch is malformed."""
    check_seconds(rep.iteration_time, "iteration_time", f"report {i}: ", MIN_SECONDS, MAX_SECONDS)
    check_energy(rep.energy, "energy", f"report {i}: ")
    if rep.sequence < 0:
        raise BadRequest(f"report {i}: must be >= 0, got {rep.sequence}", field="sequence")
    if rep.incarnation < 0:
        raise BadRequest(f"report {i}: must be >= 0, got {rep.incarnation}", field="incarnation")
    validate_clock_control(f"report {i}", rep.clock_control, rep.clock_control_reason)
    validate_power_floor(f"report {i}", rep)
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
        _check_transfers(i, rep, job, rank or _reporter_rank(job, i, rep.rank_id))


def transfers_per_iteration(job: Job, pipeline_rank: int) -> int:
    """The most P2P transfers a rank at ``pipeline_rank`` makes in one iteration.

    For every boundary it is an end of (twice when it runs both stages), each microbatch's
    activations forward and gradients backward.
    """
    ends = sum((a == pipeline_rank) + (b == pipeline_rank) for a, b in job.boundary_ends)
    return ends * len(TRANSFER_DIRECTIONS) * job.spec.microbatches


def _check_transfer_count(i: int, count: int, job: Job, rank: RankInfo) -> None:
    most = transfers_per_iteration(job, rank.pipeline_rank)
    if count > most:
        raise BadRequest(
            f"report {i}: {count} transfers, but pipeline rank {rank.pipeline_rank} makes at "
            f"most {most} P2P transfers in one iteration of {job.spec.microbatches} microbatches",
            field="transfers",
        )


def _check_transfers(i: int, rep: IterationReport, job: Job, rank: RankInfo) -> None:
    """Check the report's timed transfers.

    At most as many as its rank makes in one iteration (:func:`transfers_per_iteration`), each
    on a boundary of the job's model (``0 <= boundary < stages - 1``) that the rank is an end of
    (only a link's two ends time its transfers), a known direction, a microbatch of the job, a
    time within :mod:`perseus_server.domain.bounds`. The count is checked first: a long list is
    refused before any item is looked at.
    """
    _check_transfer_count(i, len(rep.transfers), job, rank)
    ends, microbatches = job.boundary_ends, job.spec.microbatches
    for j, t in enumerate(rep.transfers):
        where = f"report {i} transfers[{j}]: "
        if not 0 <= t.boundary < len(ends):
            raise BadRequest(
                f"{where}boundary must be between 0 and {len(ends) - 1} (the boundary between "
                f"stage b and b + 1 of {job.schedule.stages} stages), got {t.boundary}",
                field="transfers.boundary",
            )
        if rank.pipeline_rank not in ends[t.boundary]:
            a, b = ends[t.boundary]
            raise BadRequest(
                f"{where}boundary {t.boundary} links pipeline ranks {a} and {b}; pipeline rank "
                f"{rank.pipeline_rank} is not an end of it and cannot time its transfers",
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
            f"{where}: unknown instruction {m.instruction[:32]!r}",
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


def _check_reasons(where: str, reasons: tuple[str, ...], field: str) -> None:
    if len(reasons) > MAX_REASONS:
        raise BadRequest(f"{where}: at most {MAX_REASONS} reasons", field=field)
    for r in reasons:
        if not _REASON.fullmatch(r):
            raise BadRequest(
                f"{where}: a reason is 1 to 64 of [a-z0-9_], got {r[:80]!r}", field=field
            )


def validate_applied_clocks(i: int, rep: IterationReport, job: Job, limits: Limits) -> None:
    """Raise :class:`BadRequest` naming the field when report ``i``'s applied clocks are malformed.

    Old clients send no applied-clock fields: nothing to check.
    """
    if rep.clock_samples < 0:
        raise BadRequest(
            f"report {i}: must be >= 0, got {rep.clock_samples}", field="clock_samples"
        )
    _check_reasons(f"report {i}", rep.clock_event_reasons, "clock_event_reasons")
    most = min(MAX_OFF_PLAN, limits.max_report_instructions)
    if len(rep.off_plan) > most:
        raise BadRequest(
            f"report {i}: off_plan has {len(rep.off_plan)} instructions, at most {most}",
            field="off_plan",
        )
    for j, o in enumerate(rep.off_plan):
        where = f"report {i} off_plan[{j}]"
        if o.instruction not in INSTRUCTION_KINDS:
            raise BadRequest(
                f"{where}: unknown instruction {o.instruction[:32]!r}", field="off_plan.instruction"
            )
        if not 0 <= o.microbatch < job.spec.microbatches:
            raise BadRequest(f"{where}: microbatch out of range", field="off_plan.microbatch")
        if o.stage is not None and not 0 <= o.stage < job.schedule.stages:
            raise BadRequest(f"{where}: stage out of range", field="off_plan.stage")
        for name, mhz in (("locked_mhz", o.locked_mhz), ("sampled_mhz", o.sampled_mhz)):
            if not 0 <= mhz <= MAX_FREQUENCY_MHZ:
                raise BadRequest(
                    f"{where}: {name} must be between 0 and {MAX_FREQUENCY_MHZ} MHz",
                    field=f"off_plan.{name}",
                )
        if o.samples < 0:
            raise BadRequest(f"{where}: samples must be >= 0", field="off_plan.samples")
        _check_reasons(where, o.reasons, "off_plan.reasons")


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


def report_stage_factors(
    job: Job, rank: RankInfo, instructions: Sequence[InstructionReport]
) -> dict[int, float] | None:
    """One report's slowdown factor per stage (None when no plan runs).

    Each measurement's time over its profiled time, grouped by stage (in first-seen order; a
    measurement the profile has no positive time for is left out), given to the one statistic,
    :func:`perseus_server.decisions.report_statistics.stage_factors`. Rows and
    :class:`~perseus_server.domain.instruction_columns.InstructionColumns` alike.

    Free of side effects on the job beyond the profile's lookup tables, so a large report can
    be measured off the event loop. Expects validated measurements.
    """
    profile = job.profile.current
    if job.deployment.plan is None or job.frontier.current is None or profile is None:
        return None
    per_rank = profile.stages == job.schedule.ranks
    if isinstance(instructions, InstructionColumns):
        return stage_factors(_column_ratios(job, rank, instructions, per_rank))
    ratios: dict[int, list[float]] = {}
    for m in instructions:
        stage = rank.pipeline_rank if per_rank else int(m.stage)
        t = job.profile.time_of(stage, m.instruction, m.frequency_mhz)
        if t is not None and t > 0:
            ratios.setdefault(stage, []).append(float(m.time) / t)
    return stage_factors(ratios)


def checked_stage_factors(
    job: Job, rank: RankInfo, rep: IterationReport
) -> dict[int, float] | None:
    """The report's per-stage factors, each within :func:`bounded_factor`'s bounds.

    None for an iteration that ran off-plan (some instruction more than a clock step below its
    locked clock): its slowness is its clocks', which the off-plan straggler path of
    :mod:`perseus_server.decisions.detectors` acts on, not its stages' pace at their locked
    clocks (counting it in both made which path fired first a race).
    """
    if rep.off_plan:
        return None
    factors = report_stage_factors(job, rank, rep.instructions)
    return None if factors is None else {s: bounded_factor(f) for s, f in factors.items()}


def _column_ratios(
    job: Job, rank: RankInfo, cols: InstructionColumns, per_rank: bool
) -> dict[int, npt.NDArray[np.float64]]:
    """The ratios of a large report, per stage in first-seen order, by array operations.

    One profile lookup per distinct (stage, instruction, clock), then a sort (``O(n log n)``
    array work, ``O(distinct)`` Python work); the same groups as the loop over rows.
    """
    n = len(cols)
    if per_rank:
        stage = np.full(n, rank.pipeline_rank, dtype=np.int64)
    else:
        stage = cols.stage.astype(np.int64)
    nk = max(len(cols.kinds), 1)
    span = MAX_FREQUENCY_MHZ + 1
    key = (stage * nk + cols.kind) * span + cols.frequency_mhz
    keys, inverse = np.unique(key, return_inverse=True)
    profiled = np.empty(len(keys), dtype=np.float64)
    for u, k in enumerate(keys.tolist()):
        sk, mhz = divmod(k, span)
        s, kd = divmod(sk, nk)
        t = job.profile.time_of(s, cols.kinds[kd], mhz)
        profiled[u] = t if t is not None and t > 0 else np.nan
    per_row = profiled[inverse.reshape(-1)]
    use = ~np.isnan(per_row)
    ratios = cols.time[use] / per_row[use]
    stage = stage[use]
    order = np.argsort(stage, kind="stable")
    stage, ratios = stage[order], ratios[order]
    starts = np.flatnonzero(np.r_[True, stage[1:] != stage[:-1]]) if len(stage) else stage
    bounds = np.r_[starts, len(stage)].astype(np.int64)
    first = order[starts] if len(stage) else starts  # each stage's first row among those used
    out: dict[int, npt.NDArray[np.float64]] = {}
    for g in np.argsort(first, kind="stable").tolist():
        lo, hi = int(bounds[g]), int(bounds[g + 1])
        out[int(stage[lo])] = ratios[lo:hi]
    return out
