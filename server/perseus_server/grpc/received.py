"""A ``ReportIterations`` message as the service takes it: the adapter hands the service the
message and how to decode it, and the service decides where (on the event loop, a thread, or
the report worker process from the wire bytes; see
:meth:`~perseus_server.service.facade.PerseusService.ingest_report`)."""

from __future__ import annotations

from dataclasses import dataclass

from perseus_common.proto import perseus_pb2 as pb
from perseus_server.domain.values import IterationReport
from perseus_server.grpc.codec import decode_report

__all__ = ["WireReport"]


@dataclass(frozen=True)
class WireReport:
    """A ``ReportIterations`` message as the service takes it
    (:class:`~perseus_server.service.report_checks.ReceivedReport`)."""

    message: pb.IterationReport

    @property
    def size(self) -> int:
        """Measurements and off-plan instructions: what decides where it is decoded."""
        return len(self.message.instructions) + len(self.message.off_plan)

    def decode(self) -> IterationReport:
        return decode_report(self.message)

    def wire(self) -> bytes:
        return self.message.SerializeToString()
