"""Building what the client reports: the iteration record on the training thread
(:class:`IterationRecorder`) and its ``IterationReport`` message off it (:func:`report_message`).

The training thread only appends: one :class:`~perseus_client.measurements.InstructionMeasurement`
per measured instruction, one plain tuple per timed transfer
(:meth:`PerseusClient.record_transfer`). Everything that checks or converts (CUDA events resolved,
times clamped to be positive, transfers the server would refuse dropped) runs in the reporter
thread when the message is built.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from perseus_client.gpu.applied import AppliedClockReport
from perseus_client.measurements import (
    TRANSFER_DIRECTIONS,
    InstructionMeasurement,
    IterationMeasurement,
    Transfer,
)
from perseus_common.proto import perseus_pb2

__all__ = ["IterationRecorder", "report_message", "valid_transfer", "MAX_TRANSFER_SECONDS"]

log = logging.getLogger("perseus_client.reports")

TINY = 1e-9
"""The shortest time a report carries: the server wants strictly positive times; a clock tick can
read 0."""
MAX_TRANSFER_SECONDS = 1e6
"""The longest transfer time the server accepts (its bound on any measured time)."""

_dropped_logged = False


class IterationRecorder:
    """What one iteration measured so far (training thread only; no lock).

    :meth:`start` gives fresh lists; the client appends to :attr:`instructions`, :attr:`events`
    and :attr:`transfers` directly (an attribute lookup and an append: the hot path);
    :meth:`finish` freezes them into an :class:`IterationMeasurement`.
    """

    __slots__ = ("instructions", "events", "transfers")

    def __init__(self) -> None:
        self.instructions: list[InstructionMeasurement] = []
        self.events: list[tuple[Any, Any]] = []
        self.transfers: list[Transfer] = []

    def start(self) -> None:
        self.instructions = []
        self.events = []
        self.transfers = []

    def finish(
        self,
        index: int,
        iteration_time: float,
        plan_version: int,
        energy: float,
        applied: AppliedClockReport | None,
    ) -> IterationMeasurement:
        return IterationMeasurement(
            index,
            iteration_time,
            plan_version,
            energy,
            tuple(self.instructions),
            tuple(self.events),
            applied,
            tuple(self.transfers),
        )


def valid_transfer(t: Transfer) -> bool:
    """Whether the server would accept ``t`` (a boundary and microbatch >= 0, a known direction,
    a finite time of at most :data:`MAX_TRANSFER_SECONDS`; a time under :data:`TINY` is sent as
    :data:`TINY`)."""
    try:
        boundary, direction, microbatch, seconds = t
        return (
            int(boundary) == boundary
            and 0 <= boundary < 2**31
            and int(microbatch) == microbatch
            and 0 <= microbatch < 2**31
            and direction in TRANSFER_DIRECTIONS
            and math.isfinite(seconds)
            and seconds <= MAX_TRANSFER_SECONDS
        )
    except (TypeError, ValueError):
        return False


def _transfer_messages(rec: IterationMeasurement) -> list[Any]:
    global _dropped_logged
    out = []
    for t in rec.transfers:
        if not valid_transfer(t):
            if not _dropped_logged:
                _dropped_logged = True
                log.warning(
                    "perseus: dropped a recorded transfer the server would refuse: %r "
                    "(boundary and microbatch >= 0, direction forward or backward, a finite "
                    "time in seconds); logged once",
                    t,
                )
            continue
        boundary, direction, microbatch, seconds = t
        out.append(
            perseus_pb2.TransferMeasurement(
                boundary=int(boundary),
                direction=direction,
                microbatch=int(microbatch),
                time=max(float(seconds), TINY),
            )
        )
    return out


def _applied_clock_fields(rec: IterationMeasurement) -> dict[str, Any]:
    """The report's applied-clock fields (none when nobody sampled)."""
    applied = rec.applied_clocks
    if applied is None or not applied.samples:
        return {}
    return {
        "clock_samples": applied.samples,
        "clock_event_reasons": list(applied.reasons),
        "off_plan": [
            perseus_pb2.OffPlanInstruction(
                instruction=o.kind,
                microbatch=o.microbatch,
                stage=o.stage,
                locked_mhz=o.locked_mhz,
                sampled_mhz=o.sampled_mhz,
                reasons=list(o.reasons),
                samples=o.samples,
            )
            for o in applied.off_plan
        ],
    }


def report_message(
    record: IterationMeasurement,
    *,
    job_id: str,
    rank_id: str,
    sequence: int,
    incarnation: int,
    clock_control: Any,
) -> Any:
    """The ``IterationReport`` of ``record`` (CUDA events resolved: may block on the GPU)."""
    rec = record.resolved()
    return perseus_pb2.IterationReport(
        job_id=job_id,
        rank_id=rank_id,
        iteration=rec.iteration,
        iteration_time=max(rec.iteration_time, TINY),
        plan_version=rec.plan_version,
        energy=max(rec.energy, 0.0),
        sequence=sequence,
        incarnation=incarnation,
        clock_control=clock_control,
        instructions=[
            perseus_pb2.InstructionMeasurement(
                instruction=m.kind,
                microbatch=m.microbatch,
                frequency_mhz=m.frequency_mhz,
                time=max(m.time, TINY),
                energy=max(m.energy, 0.0),
                stage=m.stage,
            )
            for m in rec.instructions
        ],
        transfers=_transfer_messages(rec),
        **_applied_clock_fields(rec),
    )
