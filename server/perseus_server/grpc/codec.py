"""Protobuf (``perseus.v1``) to and from the service's plain values
(:mod:`perseus_server.domain.values`): the one place the server builds or reads wire messages.

Plan messages are encoded once per :class:`~perseus_server.domain.values.PlanUpdate` object
(the service hands one object to every stream of the same plan), so a push to many streams
builds the protobuf message once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from perseus_common.proto import perseus_pb2 as pb
from perseus_server.domain.values import (
    InstructionColumns,
    InstructionReport,
    IterationReport,
    OffPlanReport,
    PlanUpdate,
    RankRegistration,
    RegisteredRank,
    TransferReport,
)

__all__ = [
    "PlanEncoder",
    "decode_registration",
    "decode_report",
    "decode_report_bytes",
    "decode_report_columns",
    "encode_plan",
    "encode_registered",
]


def decode_registration(req: pb.RegisterRankRequest) -> RankRegistration:
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
        clock_control=_CLOCK_CONTROL.get(req.clock_control.state, "?"),
        clock_control_reason=req.clock_control.reason,
    )


#: ``ClockControlState`` values as the domain names them ("?": a value this server does not know).
_CLOCK_CONTROL = {
    pb.CLOCK_CONTROL_UNSPECIFIED: "",
    pb.CLOCK_CONTROL_ACTIVE: "active",
    pb.CLOCK_CONTROL_UNAVAILABLE: "unavailable",
}


def encode_registered(resp: RegisteredRank) -> pb.RegisterRankResponse:
    return pb.RegisterRankResponse(
        rank_id=resp.rank_id,
        plan_version=resp.plan_version,
        stages=resp.stages,
        microbatches=resp.microbatches,
        max_clock_mhz=resp.max_clock_mhz,
    )


def decode_report(rep: pb.IterationReport) -> IterationReport:
    """The report with one :class:`InstructionReport` per measurement (small reports)."""
    return _report(
        rep,
        tuple(
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
    )


def decode_report_columns(rep: pb.IterationReport) -> IterationReport:
    """The report with its measurements as :class:`InstructionColumns` (equal to
    :func:`decode_report`'s): one pass per field over the repeated message, no object per
    measurement beyond the protobuf's own."""
    ms = rep.instructions
    n = len(ms)
    index: dict[str, int] = {}
    kind = np.fromiter(
        (index.setdefault(m.instruction, len(index)) for m in ms), dtype=np.int32, count=n
    )
    cols = InstructionColumns(
        kinds=tuple(index),
        kind=kind,
        microbatch=np.fromiter((m.microbatch for m in ms), dtype=np.int32, count=n),
        frequency_mhz=np.fromiter((m.frequency_mhz for m in ms), dtype=np.int32, count=n),
        time=np.fromiter((m.time for m in ms), dtype=np.float64, count=n),
        energy=np.fromiter((m.energy for m in ms), dtype=np.float64, count=n),
        stage=np.fromiter((m.stage for m in ms), dtype=np.int32, count=n),
    )
    return _report(rep, cols)


def decode_report_bytes(data: bytes) -> IterationReport:
    """:func:`decode_report_columns` of a serialized ``IterationReport`` (what the report
    worker process runs: see :mod:`perseus_server.runtime.parse_pool`)."""
    return decode_report_columns(pb.IterationReport.FromString(data))


def _report(
    rep: pb.IterationReport, instructions: tuple[InstructionReport, ...] | InstructionColumns
) -> IterationReport:
    return IterationReport(
        job_id=rep.job_id,
        rank_id=rep.rank_id,
        iteration=rep.iteration,
        iteration_time=rep.iteration_time,
        plan_version=rep.plan_version,
        instructions=instructions,
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
        clock_control=_CLOCK_CONTROL.get(rep.clock_control.state, "?"),
        clock_control_reason=rep.clock_control.reason,
        transfers=tuple(
            TransferReport(t.boundary, t.direction, t.microbatch, t.time) for t in rep.transfers
        ),
    )


def encode_plan(update: PlanUpdate) -> pb.PlanUpdate:
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


class PlanEncoder:
    """:func:`encode_plan` with a bounded cache per plan object (identity)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        # id -> (the value, kept alive so that its id stays its own; its encoding)
        self._cache: OrderedDict[int, tuple[PlanUpdate, pb.PlanUpdate]] = OrderedDict()

    def __call__(self, update: PlanUpdate) -> pb.PlanUpdate:
        key = id(update)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is update:
            self._cache.move_to_end(key)
            return hit[1]
        msg = encode_plan(update)
        self._cache[key] = (update, msg)
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return msg
