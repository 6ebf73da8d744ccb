"""Protobuf (``perseus.v1``) to and from the service's plain values.

The server's side of :mod:`perseus_common.wire.codec` (the encoders and decoders both ends share),
plus what only the server needs: a large report's measurements decoded into columns, and plan
messages encoded and serialized once per :class:`~perseus_server.domain.values.PlanUpdate` object
(the service hands one object to every stream of the same plan, so a push to many streams
serializes the message once).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import decode_report, encode_plan
from perseus_common.wire.values import IterationReport, PlanUpdate
from perseus_server.domain.values import InstructionColumns

__all__ = ["PlanEncoder", "decode_report_bytes", "decode_report_columns"]


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


class PlanEncoder:
    """The serialized ``PlanUpdate`` message of a plan, with a bounded cache per plan object.

    The service hands one object to every stream of the same plan (per version, pipeline plan
    and stage), so a push serializes each distinct message once, not once per stream: the
    ``WatchPlan`` handler writes these bytes as they are (see
    :func:`perseus_server.grpc.service.add_to_server`).
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        # id -> (the value, kept alive so that its id stays its own; its serialized message)
        self._cache: OrderedDict[int, tuple[PlanUpdate, bytes]] = OrderedDict()

    def __call__(self, update: PlanUpdate) -> bytes:
        """:func:`encode_plan` of ``update``, serialized: once per object (while cached)."""
        key = id(update)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is update:
            self._cache.move_to_end(key)
            return hit[1]
        data = encode_plan(update).SerializeToString()
        self._cache[key] = (update, data)
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return data
