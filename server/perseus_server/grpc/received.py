"""A ``ReportIterations`` message as the service takes it.

The adapter hands the service the message and how to decode it, and the service decides where (on
the event loop, a thread, or the report worker process from the wire bytes; see
:meth:`~perseus_server.service.facade.PerseusService.ingest_report`).
"""

from __future__ import annotations

from dataclasses import dataclass

from perseus_common.proto import perseus_pb2 as pb
from perseus_server.domain.values import IterationReport
from perseus_server.grpc.codec import decode_report

__all__ = ["WireReport"]


@dataclass(frozen=True)
class WireReport:
    """A ``ReportIterations`` message as the service takes it.

    See :class:`~perseus_server.service.report_checks.ReceivedReport`.
    """

    message: pb.IterationReport
    #: What the service checks before decoding (read once here: plain values, not calls).
    job_id: str = ""
    rank_id: str = ""
    transfers: int = 0

    @classmethod
    def of(cls, message: pb.IterationReport) -> WireReport:
        """Wrap a received ``IterationReport`` message."""
        return cls(message, message.job_id, message.rank_id, len(message.transfers))

    @property
    def size(self) -> int:
        """Measurements, off-plan instructions and transfers: what decides where it is decoded.

        Their count.
        """
        m = self.message
        return len(m.instructions) + len(m.off_plan) + len(m.transfers)

    def decode(self) -> IterationReport:
        """Decode the message into an :class:`IterationReport`."""
        return decode_report(self.message)

    def wire(self) -> bytes:
        """The message's wire bytes, for the report worker process."""
        return self.message.SerializeToString()
