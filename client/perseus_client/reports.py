"""Building what the client reports: the iteration record and its wire value and message.

The iteration record on the training thread (:class:`IterationRecorder`) and, off it, its wire value
(:func:`report_value`, a :class:`perseus_common.wire.IterationReport`) and message
(:func:`report_message`, through the codec both ends share).

The training thread only appends: one :class:`~perseus_client.measurements.InstructionMeasurement`
per measured instruction, one plain tuple per timed transfer
(:meth:`PerseusClient.record_transfer`). Everything that checks or converts (CUDA events resolved,
times clamped to be positive, transfers the server would refuse dropped) runs in the reporter
thread when the message is built.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from perseus_client.gpu.applied import EMPTY_REPORT, AppliedClockReport
from perseus_client.measurements import (
    TRANSFER_DIRECTIONS,
    InstructionMeasurement,
    IterationMeasurement,
    Transfer,
)
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import encode_report
from perseus_common.wire.values import InstructionReport, IterationReport, TransferReport

__all__ = [
    "IterationRecorder",
    "report_message",
    "report_value",
    "valid_transfer",
    "MAX_TRANSFER_SECONDS",
]

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
        #: The records, or what builds them off the training thread (the client's hot path).
        self.instructions: (
            list[InstructionMeasurement] | Callable[[], tuple[InstructionMeasurement, ...]]
        ) = []
        self.events: list[tuple[Any, Any]] = []
        self.transfers: list[Transfer] = []

    def start(self) -> None:
        """Start recording a new iteration: empty the instructions, events and transfers."""
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
        """The iteration's measurement, from what was recorded and the given figures."""
        return IterationMeasurement(
            index,
            iteration_time,
            plan_version,
            energy,
            self.instructions if callable(self.instructions) else tuple(self.instructions),
            tuple(self.events),
            applied,
            tuple(self.transfers),
        )


def valid_transfer(t: Transfer) -> bool:
    """Whether the server would accept ``t``.

    A boundary and microbatch >= 0, a known direction, a finite time of at most
    :data:`MAX_TRANSFER_SECONDS`; a time under :data:`TINY` is sent as :data:`TINY`).
    """
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


def _transfers(rec: IterationMeasurement) -> tuple[TransferReport, ...]:
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
            TransferReport(int(boundary), direction, int(microbatch), max(float(seconds), TINY))
        )
    return tuple(out)


def report_value(
    record: IterationMeasurement,
    *,
    job_id: str,
    rank_id: str,
    sequence: int,
    incarnation: int,
    clock_control: str = "",
    clock_control_reason: str = "",
    power_floor: tuple[str, str, float] | None = None,
) -> IterationReport:
    """The wire value of ``record`` (CUDA events resolved: may block on the GPU).

    Times are clamped to at least :data:`TINY`, energies to at least 0, and transfers the server
    would refuse dropped (logged once).
    """
    rec = record.resolved()
    applied = rec.applied_clocks
    if applied is None or not applied.samples:
        applied = EMPTY_REPORT  # nobody sampled: no applied-clock fields
    return IterationReport(
        job_id=job_id,
        rank_id=rank_id,
        iteration=rec.iteration,
        iteration_time=max(rec.iteration_time, TINY),
        plan_version=rec.plan_version,
        instructions=tuple(
            InstructionReport(
                m.kind,
                m.microbatch,
                m.frequency_mhz,
                max(m.time, TINY),
                max(m.energy, 0.0),
                m.stage,
            )
            for m in rec.instructions
        ),
        energy=max(rec.energy, 0.0),
        sequence=sequence,
        off_plan=applied.off_plan,
        clock_samples=applied.samples,
        clock_event_reasons=applied.reasons,
        incarnation=incarnation,
        clock_control=clock_control,
        clock_control_reason=clock_control_reason,
        transfers=_transfers(rec),
        power_floor=power_floor[0] if power_floor else "",
        power_floor_reason=power_floor[1] if power_floor else "",
        power_floor_swing=power_floor[2] if power_floor else 0.0,
    )


def report_message(
    record: IterationMeasurement,
    *,
    job_id: str,
    rank_id: str,
    sequence: int,
    incarnation: int,
    clock_control: str = "",
    clock_control_reason: str = "",
    power_floor: tuple[str, str, float] | None = None,
) -> pb.IterationReport:
    """The ``IterationReport`` message of ``record``: :func:`report_value`, encoded."""
    return encode_report(
        report_value(
            record,
            job_id=job_id,
            rank_id=rank_id,
            sequence=sequence,
            incarnation=incarnation,
            clock_control=clock_control,
            clock_control_reason=clock_control_reason,
            power_floor=power_floor,
        )
    )
