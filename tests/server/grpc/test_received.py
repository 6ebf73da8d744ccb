"""``grpc/received.py``: a ``ReportIterations`` message as the service takes it.

What the service checks before decoding (job, rank, counts) is read from the message once; the
decoding itself is the wire codec's, bound to the message, and its bytes go to the report worker
as they came.
"""

from __future__ import annotations

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import decode_report
from perseus_server.grpc.received import WireReport


def _message() -> pb.IterationReport:
    return pb.IterationReport(
        job_id="j",
        rank_id="j-0-ab",
        iteration=9,
        iteration_time=0.5,
        plan_version=4,
        instructions=[
            pb.InstructionMeasurement(instruction="forward", microbatch=m, frequency_mhz=1410)
            for m in range(3)
        ],
        off_plan=[pb.OffPlanInstruction(instruction="forward", locked_mhz=1410, sampled_mhz=900)],
        transfers=[
            pb.TransferMeasurement(boundary=0, direction=d, microbatch=0, time=0.002)
            for d in ("forward", "backward")
        ],
    )


def test_what_is_checked_before_decoding_is_read_from_the_message() -> None:
    report = WireReport.of(_message())
    assert (report.job_id, report.rank_id, report.transfers, report.size) == ("j", "j-0-ab", 2, 6)


def test_decoding_is_the_codecs_and_the_bytes_are_the_messages() -> None:
    message = _message()
    report = WireReport.of(message)
    assert report.decode() == decode_report(message)
    assert pb.IterationReport.FromString(report.wire()) == message


def test_an_empty_report_has_nothing_to_decode() -> None:
    report = WireReport.of(pb.IterationReport(job_id="j", rank_id="r"))
    assert (report.transfers, report.size) == (0, 0)
    assert report.decode().instructions == ()
