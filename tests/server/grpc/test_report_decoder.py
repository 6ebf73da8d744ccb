"""The columnar report path gives exactly what the one-object-per-measurement path gave.

The oracles below are the decoder, the measurement check and the profiling conversion as they
were before reports were decoded into columns (kept verbatim here); hypothesis compares them
with :func:`decode_report_columns`, :func:`validate_report` and :func:`report_stage_factors` (the one
per-stage statistic, given rows or columns) on random reports, malformed ones included.
"""

from __future__ import annotations

import math
import statistics
import struct
from types import SimpleNamespace
from typing import Any, cast

from hypothesis import example, given, settings
from hypothesis import strategies as st

from perseus.profiles import INSTRUCTION_KINDS
from perseus_common.profile_csv import MAX_FREQUENCY_MHZ
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import decode_report
from perseus_common.wire.values import InstructionReport, IterationReport, OffPlanReport
from perseus_server.config import Limits
from perseus_server.decisions.profiling_scan import Measurement
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.instruction_columns import InstructionColumns
from perseus_server.grpc.report_decoder import decode_report_bytes, decode_report_columns
from perseus_server.service.report_checks import (
    first_bad_instruction,
    measurements,
    report_stage_factors,
    validate_report,
)

STAGES, MICROBATCHES = 4, 8


# --- the oracles (the code before the columnar path) ----------------------------------------


def old_decode_report(rep: pb.IterationReport) -> IterationReport:
    return IterationReport(
        job_id=rep.job_id,
        rank_id=rep.rank_id,
        iteration=rep.iteration,
        iteration_time=rep.iteration_time,
        plan_version=rep.plan_version,
        instructions=tuple(
            InstructionReport(
                instruction=m.instruction,
                microbatch=m.microbatch,
                frequency_mhz=m.frequency_mhz,
                time=m.time,
                energy=m.energy,
                stage=m.stage,
            )
            for m in rep.instructions
        ),
        energy=rep.energy,
        sequence=rep.sequence,
        off_plan=tuple(
            OffPlanReport(
                instruction=o.instruction,
                microbatch=o.microbatch,
                stage=o.stage if o.HasField("stage") else None,
                locked_mhz=o.locked_mhz,
                sampled_mhz=o.sampled_mhz,
                reasons=tuple(o.reasons),
                samples=o.samples,
            )
            for o in rep.off_plan
        ),
        clock_samples=rep.clock_samples,
        clock_event_reasons=tuple(rep.clock_event_reasons),
    )


def old_check_instructions(i: int, rep: IterationReport, job: Any, limits: Limits) -> None:
    if len(rep.instructions) > limits.max_report_instructions:
        raise BadRequest(
            f"report {i}: at most {limits.max_report_instructions} measurements",
            field="instructions",
        )
    for j, m in enumerate(rep.instructions):
        where = f"report {i} instructions[{j}]"
        if m.instruction not in INSTRUCTION_KINDS:
            raise BadRequest(  # the name quoted back cut at 32 characters, as the server does
                f"{where}: unknown instruction {m.instruction[:32]!r}",
                field="instructions.instruction",
            )
        if not (math.isfinite(m.time) and 0 < m.time <= 1e6):
            raise BadRequest(
                f"{where}: time must be a positive number of seconds up to 1e+06, got {m.time!r}",
                field="instructions.time",
            )
        if not (math.isfinite(m.energy) and 0 <= m.energy <= 1e10):
            raise BadRequest(
                f"{where}: energy must be finite, >= 0 and at most 1e+10 J, got {m.energy!r}",
                field="instructions.energy",
            )
        if not (0 <= m.stage < job.schedule.stages) or not (
            0 <= m.microbatch < job.spec.microbatches
        ):
            raise BadRequest(
                f"{where}: stage or microbatch out of range", field="instructions.stage"
            )
        if not 0 <= m.frequency_mhz <= MAX_FREQUENCY_MHZ:
            raise BadRequest(
                f"{where}: frequency must be between 0 and {MAX_FREQUENCY_MHZ} MHz",
                field="instructions.frequency_mhz",
            )


def old_stage_factors(job: Any, rank: Any, instructions: Any) -> dict[int, float] | None:
    """The per-stage factors one measurement at a time.

    The row path before there was one implementation: the median measured/profiled time per
    stage, stages in first-seen order.
    """
    profile = job.profile.current
    if job.deployment.plan is None or job.frontier.current is None or profile is None:
        return None
    per_rank = profile.stages == job.schedule.ranks
    ratios: dict[int, list[float]] = {}
    for m in instructions:
        stage = rank.pipeline_rank if per_rank else int(m.stage)
        t = job.profile.time_of(stage, m.instruction, m.frequency_mhz)
        if t is not None and t > 0:
            ratios.setdefault(stage, []).append(float(m.time) / t)
    return {stage: statistics.median(rs) for stage, rs in ratios.items()}


def old_measurements(rep: IterationReport) -> list[Measurement]:
    return [
        Measurement(m.instruction, m.stage, m.frequency_mhz, m.time, m.energy)
        for m in rep.instructions
    ]


# --- strategies --------------------------------------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=64)


def _measurement(valid: bool) -> st.SearchStrategy[pb.InstructionMeasurement]:
    if valid:
        return st.builds(
            pb.InstructionMeasurement,
            instruction=st.sampled_from(sorted(INSTRUCTION_KINDS)),
            microbatch=st.integers(0, MICROBATCHES - 1),
            frequency_mhz=st.sampled_from([0, 1000, 1410, 1740, MAX_FREQUENCY_MHZ]),
            time=st.floats(1e-300, 1e3),
            energy=st.one_of(st.just(0.0), st.floats(0, 1e6)),
            stage=st.integers(0, STAGES - 1),
        )
    return st.builds(
        pb.InstructionMeasurement,
        instruction=st.one_of(
            st.sampled_from(sorted(INSTRUCTION_KINDS) + ["", "fwd", "Forward"]), st.text()
        ),
        microbatch=st.one_of(st.integers(-2, MICROBATCHES + 1), INT32),
        frequency_mhz=st.one_of(
            st.sampled_from([-1, 0, 1740, MAX_FREQUENCY_MHZ, MAX_FREQUENCY_MHZ + 1]), INT32
        ),
        time=st.one_of(st.sampled_from([0.0, -0.0, -1.0, 5e-324, 0.01]), ANY_FLOAT),
        energy=st.one_of(st.sampled_from([0.0, -0.0, -1e-9, 2.5]), ANY_FLOAT),
        stage=st.one_of(st.integers(-2, STAGES + 1), INT32),
    )


MEASUREMENTS = st.lists(
    st.one_of(_measurement(True), _measurement(True), _measurement(False)), max_size=40
)

OFF_PLAN = st.lists(
    st.builds(
        pb.OffPlanInstruction,
        instruction=st.sampled_from(["forward", "backward", "x"]),
        microbatch=st.integers(-1, MICROBATCHES),
        stage=st.one_of(st.none(), st.integers(-1, STAGES)),
        locked_mhz=st.integers(0, 2000),
        sampled_mhz=st.integers(0, 2000),
        reasons=st.lists(st.sampled_from(["hw_slowdown", "sw_power_cap"]), max_size=2),
        samples=st.integers(0, 10),
    ),
    max_size=3,
)


@st.composite
def reports(draw: st.DrawFn) -> pb.IterationReport:
    return pb.IterationReport(
        job_id=draw(st.text(max_size=8)),
        rank_id=draw(st.text(max_size=8)),
        iteration=draw(st.integers(0, 2**63 - 1)),
        iteration_time=draw(st.sampled_from([1.0, 0.25])),
        plan_version=draw(st.integers(-(2**63), 2**63 - 1)),
        instructions=draw(MEASUREMENTS),
        energy=draw(st.sampled_from([0.0, 12.5])),
        sequence=draw(st.integers(0, 2**63 - 1)),
        off_plan=draw(OFF_PLAN),
        clock_samples=draw(st.integers(0, 100)),
        clock_event_reasons=draw(st.lists(st.sampled_from(["hw_slowdown", "idle"]), max_size=2)),
    )


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _same(a: Any, b: Any) -> bool:
    """Equal, NaNs included (bit for bit)."""
    if isinstance(a, float) and isinstance(b, float):
        return _bits(a) == _bits(b)
    return type(a) is type(b) and a == b


def _same_measurements(a: Any, b: Any) -> None:
    a, b = list(a), list(b)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert type(x) is type(y)
        for f in x.__dataclass_fields__:
            assert _same(getattr(x, f), getattr(y, f)), (f, x, y)


def _job(ranks: int = STAGES, profile_stages: int = STAGES, times: Any = None) -> Any:
    """What validation and the stage factors read of a job."""
    return SimpleNamespace(
        schedule=SimpleNamespace(stages=STAGES, ranks=ranks),
        spec=SimpleNamespace(microbatches=MICROBATCHES),
        profile=SimpleNamespace(current=SimpleNamespace(stages=profile_stages), time_of=times),
        deployment=SimpleNamespace(plan=object()),
        frontier=SimpleNamespace(current=object()),
    )


def _error(f: Any) -> tuple[str, str | None] | None:
    try:
        f()
    except BadRequest as e:
        return (e.detail, e.field)
    return None


# --- the properties ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(reports())
def test_columns_decode_to_the_same_values(msg: pb.IterationReport) -> None:
    old = old_decode_report(msg)
    for new in (decode_report_columns(msg), decode_report_bytes(msg.SerializeToString())):
        assert isinstance(new.instructions, InstructionColumns)
        _same_measurements(new.instructions, old.instructions)
        n = len(old.instructions)
        _same_measurements([new.instructions[j] for j in range(n)], old.instructions)
        for f in old.__dataclass_fields__:
            if f != "instructions":
                assert getattr(new, f) == getattr(old, f), f
        _same_measurements(measurements(new), old_measurements(old))
    small = decode_report(msg)
    assert isinstance(small.instructions, tuple)
    _same_measurements(small.instructions, old.instructions)
    _same_measurements(measurements(small), old_measurements(old))


@settings(max_examples=500, deadline=None)
@given(reports(), st.sampled_from([100_000, 30, 5]))
# An unknown instruction's name longer than the 32 characters an error quotes back (the case
# random search found once in CI; the reference had kept the name whole).
@example(
    pb.IterationReport(
        iteration_time=1.0,
        instructions=[pb.InstructionMeasurement(instruction="0" * 33, time=1.0)],
    ),
    100_000,
)
def test_columns_are_refused_with_the_same_error(msg: pb.IterationReport, limit: int) -> None:
    job, limits = _job(), Limits(max_report_instructions=limit)
    old = old_decode_report(msg)
    expected = _error(lambda: old_check_instructions(3, old, job, limits))
    cols = decode_report_columns(msg)
    got = _error(lambda: validate_report(3, cols, cast(Any, job), limits))
    assert got == _error(lambda: validate_report(3, old, cast(Any, job), limits))
    if expected is not None:
        assert got == expected
    else:  # the measurements pass; only the applied-clock fields may be refused
        assert got is None or not str(got[1]).startswith("instructions")
    bad = first_bad_instruction(cast(InstructionColumns, cols.instructions), STAGES, MICROBATCHES)
    if expected is None:
        assert bad is None
    elif expected[1] != "instructions":  # not the count limit: the row named is the first bad
        assert expected[0].startswith(f"report 3 instructions[{bad}]:")


def _times(stage: int, kind: str, mhz: int) -> float | None:
    """A profile lookup with misses, zeros and negative times."""
    h = (stage * 7 + len(kind) * 13 + mhz) % 11
    if h == 0:
        return None
    if h == 1:
        return 0.0
    if h == 2:
        return -0.5
    return 0.001 * h + stage * 0.01


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_measurement(True), max_size=60),
    st.booleans(),
    st.integers(0, STAGES - 1),
)
def test_stage_factors_are_the_same(
    ms: list[pb.InstructionMeasurement], per_rank: bool, pipeline_rank: int
) -> None:
    msg = pb.IterationReport(instructions=ms, iteration_time=1.0)
    job = _job(ranks=STAGES if per_rank else 2, times=_times)
    rank = SimpleNamespace(pipeline_rank=pipeline_rank)
    rows = old_decode_report(msg).instructions
    old = old_stage_factors(job, rank, rows)
    cols = decode_report_columns(msg).instructions
    assert isinstance(cols, InstructionColumns)
    # Columns (a large report) and rows (a small one) go through the one implementation.
    for new in (
        report_stage_factors(cast(Any, job), cast(Any, rank), cols),
        report_stage_factors(cast(Any, job), cast(Any, rank), rows),
    ):
        assert old is not None and new is not None
        assert list(new) == list(old)  # the same stages in the same order
        for s in old:
            assert _same(new[s], old[s]), (s, new[s], old[s])


def test_stage_factors_need_a_plan() -> None:
    job = _job(times=_times)
    job.deployment.plan = None
    cols = decode_report_columns(
        pb.IterationReport(
            instructions=[pb.InstructionMeasurement(instruction="forward", time=1.0)]
        )
    ).instructions
    assert report_stage_factors(cast(Any, job), cast(Any, None), cast(Any, cols)) is None
