"""A ``ReportIterations`` message as the service takes it.

The adapter hands the service the message and how to decode it, and the service decides where (on
the event loop, a thread, or the report worker process from the wire bytes; see
:meth:`~perseus_server.service.facade.PerseusService.ingest_report`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import decode_report
from perseus_common.wire.values import IterationReport

__all__ = ["WireReport"]


@dataclass(frozen=True)
class WireReport:
    """A ``ReportIterations`` message as the service takes it.

    See :class:`~perseus_server.service.report_checks.ReceivedReport`. Everything the service
    reads is a plain value or a callable of the wire codec bound to the message, read once
    here: the report goes on from the service to the codec and never back into this adapter.
    """

    message: pb.IterationReport
    #: The job, the rank and the number of transfers: checked before anything is decoded.
    job_id: str
    rank_id: str
    transfers: int
    #: Measurements, off-plan instructions and transfers: what decides where it is decoded.
    size: int
    #: Decode the message into an :class:`IterationReport` (the codec's function, bound).
    decode: Callable[[], IterationReport]
    #: The message's wire bytes, for the report worker process.
    wire: Callable[[], bytes]

    @classmethod
    def of(cls, message: pb.IterationReport) -> WireReport:
        """Wrap a received ``IterationReport`` message."""
        m = message
        return cls(
            m,
            m.job_id,
            m.rank_id,
            len(m.transfers),
            len(m.instructions) + len(m.off_plan) + len(m.transfers),
            partial(decode_report, m),
            m.SerializeToString,
        )
