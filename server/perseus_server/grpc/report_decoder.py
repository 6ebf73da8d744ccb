"""A report message decoded with its measurements as columns, which only the server needs.

The report's other fields are decoded by the shared codec
(:func:`perseus_common.wire.codec.decode_report`); its measurements, which a large report has by
the hundred thousand, become one array per field
(:class:`~perseus_server.domain.instruction_columns.InstructionColumns`) instead of one object
each. The report worker process decodes the message's bytes here
(:mod:`perseus_server.runtime.parse_pool`).
"""

from __future__ import annotations

import numpy as np

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import decode_report
from perseus_common.wire.values import IterationReport
from perseus_server.domain.instruction_columns import InstructionColumns

__all__ = ["decode_report_bytes", "decode_report_columns"]


def decode_report_columns(rep: pb.IterationReport) -> IterationReport:
    """The report with its measurements as :class:`InstructionColumns`.

    Equal to :func:`decode_report`'s: one pass per field over the repeated message, no object
    per measurement beyond the protobuf's own.
    """
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
    return decode_report(rep, cols)


def decode_report_bytes(data: bytes) -> IterationReport:
    """:func:`decode_report_columns` of a serialized ``IterationReport``.

    What the report worker process runs: see :mod:`perseus_server.runtime.parse_pool`.
    """
    return decode_report_columns(pb.IterationReport.FromString(data))
