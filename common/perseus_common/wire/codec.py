"""``perseus.v1`` protobuf to and from :mod:`perseus_common.wire.values`, for both ends.

One ``encode_*`` and one ``decode_*`` per message; ``decode(encode(v)) == v`` field for field
(``tests/common/wire/test_values_round_trip.py`` checks it over every field of every message). The
rank client encodes registrations, plan requests, reports and finish requests and decodes the
answers; the server's gRPC adapter does the opposite. Nothing here checks bounds or meaning:
that is each end's business (the server's ``domain/bounds.py``, the client's report builder).

A clock-control state this end does not know decodes as ``"?"``; an empty state and reason
encode as no ``ClockControl`` at all (what a client that does not say sends).

A *flat* message (scalar and repeated scalar fields only, each named as its value's field) needs
no code of its own: :func:`encode_flat` and :func:`decode_flat` convert it field for field, given
the message and value classes (a new request such message is its ``.proto`` entry and its value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.values import (
    FinishedRank,
    FinishRank,
    InstructionReport,
    IterationReport,
    OffPlanReport,
    PlanRequest,
    PlanStep,
    PlanUpdate,
    ProfilingTask,
    RankRegistration,
    RegisteredRank,
    ReportAck,
    TransferReport,
)

__all__ = [
    "decode_flat",
    "encode_flat",
    "decode_ack",
    "decode_finish",
    "decode_finished",
    "decode_instruction",
    "decode_plan",
    "decode_plan_request",
    "decode_registered",
    "decode_registration",
    "decode_report",
    "encode_ack",
    "encode_finish",
    "encode_finished",
    "encode_instruction",
    "encode_plan",
    "encode_plan_request",
    "encode_registered",
    "encode_registration",
    "encode_report",
]

#: ``ClockControlState`` values by the name the values use, and back.
_STATE = {
    "": pb.CLOCK_CONTROL_UNSPECIFIED,
    "active": pb.CLOCK_CONTROL_ACTIVE,
    "unavailable": pb.CLOCK_CONTROL_UNAVAILABLE,
}
_STATE_NAME = {v: k for k, v in _STATE.items()}


def _clock_control(state: str, reason: str) -> pb.ClockControl | None:
    if not state and not reason:
        return None
    if state not in _STATE:
        raise ValueError(f"clock_control: one of {sorted(_STATE)}, got {state!r}")
    return pb.ClockControl(state=_STATE[state], reason=reason)


def _state_name(msg: pb.ClockControl) -> str:
    return _STATE_NAME.get(msg.state, "?")


#: ``PowerFloorState`` values by the name the values use, and back.
_FLOOR = {
    "": pb.POWER_FLOOR_UNSPECIFIED,
    "held": pb.POWER_FLOOR_HELD,
    "unavailable": pb.POWER_FLOOR_UNAVAILABLE,
}
_FLOOR_NAME = {v: k for k, v in _FLOOR.items()}


def _power_floor(state: str, reason: str, plan_swing: float) -> pb.PowerFloorControl | None:
    if not state and not reason and not plan_swing:
        return None
    if state not in _FLOOR:
        raise ValueError(f"power_floor: one of {sorted(_FLOOR)}, got {state!r}")
    return pb.PowerFloorControl(state=_FLOOR[state], reason=reason, plan_swing=plan_swing)


M = TypeVar("M", bound=Message)
V = TypeVar("V")


def _flat_fields(message: type[Message], value: type[Any]) -> list[FieldDescriptor]:
    """The message's fields, checked to be flat and to be fields of ``value``."""
    names = {f.name for f in fields(value)}
    out: list[FieldDescriptor] = list(message.DESCRIPTOR.fields)  # type: ignore[arg-type]
    for f in out:
        if f.type == FieldDescriptor.TYPE_MESSAGE or f.name not in names:
            raise TypeError(f"{message.DESCRIPTOR.name}.{f.name}: not a flat field of {value}")
    return out


def encode_flat(value: Any, message: type[M]) -> M:
    """A flat message from ``value``: each of its fields from the value's field of that name."""
    return message(**{f.name: getattr(value, f.name) for f in _flat_fields(message, type(value))})


def decode_flat(msg: Message, value: type[V]) -> V:
    """A ``value`` from a flat message: each field into the value's field of that name.

    Repeated fields become tuples; the value's fields the message lacks keep their defaults.
    """
    kw: dict[str, Any] = {}
    for f in _flat_fields(type(msg), value):
        got = getattr(msg, f.name)
        kw[f.name] = tuple(got) if f.is_repeated else got
    return value(**kw)


# --- registration -------------------------------------------------------------------------------


def encode_registration(reg: RankRegistration) -> pb.RegisterRankRequest:
    """Encode a rank's registration as a ``RegisterRankRequest``."""
    return pb.RegisterRankRequest(
        job_id=reg.job_id,
        global_rank=reg.global_rank,
        pipeline_rank=reg.pipeline_rank,
        data_rank=reg.data_rank,
        tensor_rank=reg.tensor_rank,
        gpu_name=reg.gpu_name,
        supported_clocks_mhz=list(reg.supported_clocks_mhz),
        hostname=reg.hostname,
        max_power_limit_w=reg.max_power_limit_w,
        clock_control=_clock_control(reg.clock_control, reg.clock_control_reason),
    )


def decode_registration(req: pb.RegisterRankRequest) -> RankRegistration:
    """Decode a ``RegisterRankRequest`` into a :class:`RankRegistration`."""
    return RankRegistration(
        job_id=req.job_id,
        global_rank=req.global_rank,
        pipeline_rank=req.pipeline_rank,
        data_rank=req.data_rank,
        tensor_rank=req.tensor_rank,
        gpu_name=req.gpu_name,
        supported_clocks_mhz=tuple(req.supported_clocks_mhz),
        hostname=req.hostname,
        max_power_limit_w=req.max_power_limit_w,
        clock_control=_state_name(req.clock_control),
        clock_control_reason=req.clock_control.reason,
    )


def encode_registered(resp: RegisteredRank) -> pb.RegisterRankResponse:
    """Encode the server's answer to a registration as a ``RegisterRankResponse``."""
    return encode_flat(resp, pb.RegisterRankResponse)


def decode_registered(msg: pb.RegisterRankResponse) -> RegisteredRank:
    """Decode a ``RegisterRankResponse`` into a :class:`RegisteredRank`."""
    return decode_flat(msg, RegisteredRank)


# --- plans --------------------------------------------------------------------------------------


def encode_plan_request(req: PlanRequest) -> pb.WatchPlanRequest:
    """Encode a plan subscription as a ``WatchPlanRequest``."""
    return encode_flat(req, pb.WatchPlanRequest)


def decode_plan_request(msg: pb.WatchPlanRequest) -> PlanRequest:
    """Decode a ``WatchPlanRequest`` into a :class:`PlanRequest`."""
    return decode_flat(msg, PlanRequest)


def encode_plan(update: PlanUpdate) -> pb.PlanUpdate:
    """Encode a plan update (steps and any profiling task) as a ``PlanUpdate`` message."""
    msg = pb.PlanUpdate(
        version=update.version,
        reason=update.reason,
        expected_iteration_time=update.expected_iteration_time,
        steps=[
            pb.PlanStep(
                instruction=s.instruction,
                microbatch=s.microbatch,
                frequency_mhz=s.frequency_mhz,
                stage=s.stage,
            )
            for s in update.steps
        ],
        power_floors=[
            pb.PowerFloor(start_s=a, end_s=b, watts=w) for a, b, w in update.power_floors
        ],
        plan_swing=update.plan_swing,
        ramp_w_per_s=update.ramp_w_per_s,
    )
    if update.profiling is not None:
        t = update.profiling
        msg.profiling.CopyFrom(
            pb.ProfilingTask(
                frequency_mhz=t.frequency_mhz,
                warmup_iterations=t.warmup_iterations,
                iterations=t.iterations,
            )
        )
    return msg


def decode_plan(msg: pb.PlanUpdate) -> PlanUpdate:
    """Decode a ``PlanUpdate`` message, its profiling task included when set."""
    profiling = None
    if msg.HasField("profiling"):
        p = msg.profiling
        profiling = ProfilingTask(p.frequency_mhz, p.warmup_iterations, p.iterations)
    return PlanUpdate(
        version=msg.version,
        steps=tuple(
            PlanStep(s.instruction, s.microbatch, s.frequency_mhz, s.stage) for s in msg.steps
        ),
        reason=msg.reason,
        expected_iteration_time=msg.expected_iteration_time,
        profiling=profiling,
        power_floors=tuple(
            (f.start_s, f.end_s, f.watts)
            for f in msg.power_floors
            if math.isfinite(f.start_s + f.end_s + f.watts)
            and 0 <= f.start_s < f.end_s
            and f.watts > 0
        ),
        plan_swing=msg.plan_swing if math.isfinite(msg.plan_swing) else 0.0,
        ramp_w_per_s=(
            msg.ramp_w_per_s if math.isfinite(msg.ramp_w_per_s) and msg.ramp_w_per_s > 0 else 0.0
        ),
    )


# --- reports ------------------------------------------------------------------------------------


def encode_instruction(m: InstructionReport) -> pb.InstructionMeasurement:
    """Encode one instruction's measurement as an ``InstructionMeasurement``."""
    return pb.InstructionMeasurement(
        instruction=m.instruction,
        microbatch=m.microbatch,
        frequency_mhz=m.frequency_mhz,
        time=m.time,
        energy=m.energy,
        stage=m.stage,
    )


def decode_instruction(m: pb.InstructionMeasurement) -> InstructionReport:
    """Decode an ``InstructionMeasurement`` into an :class:`InstructionReport`."""
    return InstructionReport(
        instruction=m.instruction,
        microbatch=m.microbatch,
        frequency_mhz=m.frequency_mhz,
        time=m.time,
        energy=m.energy,
        stage=m.stage,
    )


def encode_report(rep: IterationReport) -> pb.IterationReport:
    """Encode an iteration report, its measurements included, as an ``IterationReport`` message."""
    return pb.IterationReport(
        job_id=rep.job_id,
        rank_id=rep.rank_id,
        iteration=rep.iteration,
        iteration_time=rep.iteration_time,
        plan_version=rep.plan_version,
        instructions=[encode_instruction(m) for m in rep.instructions],
        energy=rep.energy,
        sequence=rep.sequence,
        off_plan=[
            pb.OffPlanInstruction(
                instruction=o.instruction,
                microbatch=o.microbatch,
                stage=o.stage,
                locked_mhz=o.locked_mhz,
                sampled_mhz=o.sampled_mhz,
                reasons=list(o.reasons),
                samples=o.samples,
            )
            for o in rep.off_plan
        ],
        clock_samples=rep.clock_samples,
        clock_event_reasons=list(rep.clock_event_reasons),
        incarnation=rep.incarnation,
        clock_control=_clock_control(rep.clock_control, rep.clock_control_reason),
        power_floor=_power_floor(rep.power_floor, rep.power_floor_reason, rep.power_floor_swing),
        transfers=[
            pb.TransferMeasurement(
                boundary=t.boundary, direction=t.direction, microbatch=t.microbatch, time=t.time
            )
            for t in rep.transfers
        ],
    )


def decode_report(
    rep: pb.IterationReport, instructions: Sequence[InstructionReport] | None = None
) -> IterationReport:
    """The report, with its measurements as one :class:`InstructionReport` each.

    Unless the caller decoded them its own way (the server's columns) and passes them as
    ``instructions``.
    """
    return IterationReport(
        job_id=rep.job_id,
        rank_id=rep.rank_id,
        iteration=rep.iteration,
        iteration_time=rep.iteration_time,
        plan_version=rep.plan_version,
        instructions=tuple(decode_instruction(m) for m in rep.instructions)
        if instructions is None
        else instructions,
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
        incarnation=rep.incarnation,
        clock_control=_state_name(rep.clock_control),
        clock_control_reason=rep.clock_control.reason,
        transfers=tuple(
            TransferReport(t.boundary, t.direction, t.microbatch, t.time) for t in rep.transfers
        ),
        power_floor=_FLOOR_NAME.get(rep.power_floor.state, "?"),
        power_floor_reason=rep.power_floor.reason,
        power_floor_swing=rep.power_floor.plan_swing,
    )


def encode_ack(ack: ReportAck) -> pb.ReportAck:
    """Encode the server's answer to a batch of reports as a ``ReportAck``."""
    return encode_flat(ack, pb.ReportAck)


def decode_ack(msg: pb.ReportAck) -> ReportAck:
    """Decode a ``ReportAck`` into a :class:`ReportAck`."""
    return decode_flat(msg, ReportAck)


# --- finishing ----------------------------------------------------------------------------------


def encode_finish(req: FinishRank) -> pb.FinishRankRequest:
    """Encode a rank's finish as a ``FinishRankRequest``."""
    return encode_flat(req, pb.FinishRankRequest)


def decode_finish(msg: pb.FinishRankRequest) -> FinishRank:
    """Decode a ``FinishRankRequest`` into a :class:`FinishRank`."""
    return decode_flat(msg, FinishRank)


def encode_finished(resp: FinishedRank) -> pb.FinishRankResponse:
    """Encode the answer to a rank's finish as a ``FinishRankResponse``."""
    return encode_flat(resp, pb.FinishRankResponse)


def decode_finished(msg: pb.FinishRankResponse) -> FinishedRank:
    """Decode a ``FinishRankResponse`` into a :class:`FinishedRank`."""
    return decode_flat(msg, FinishedRank)
