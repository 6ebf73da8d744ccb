"""The values a rank and the server exchange over ``perseus.v1``, written once for both ends.

* :mod:`perseus_common.wire.values` — frozen dataclasses that mirror the messages field for
  field (registration, plans, iteration reports with their transfers and applied-clock
  findings, acknowledgements); pure Python, no protobuf;
* :mod:`perseus_common.wire.codec` — the one place either end builds or reads a ``perseus.v1``
  message: ``encode_*`` / ``decode_*`` for every message (the rank client encodes what it sends
  and decodes what it receives; the server's gRPC adapter the other way round).

Encoding is faithful: ``decode(encode(v)) == v`` for every value whose fields fit their proto
types (``tests/common/test_wire_round_trip.py``). What a value may hold (bounds, known
instruction names, supported clocks) is each end's business: the server checks it
(``perseus_server.domain.bounds``), the client clamps what it measured before encoding.

This package imports only :mod:`perseus_common.wire.values`; import the codec by its module
name (it loads protobuf), so that code that only needs the values stays free of it.
"""

from __future__ import annotations

from perseus_common.wire.values import (
    CLOCK_CONTROL_STATES,
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
    "CLOCK_CONTROL_STATES",
    "FinishRank",
    "FinishedRank",
    "InstructionReport",
    "IterationReport",
    "OffPlanReport",
    "PlanRequest",
    "PlanStep",
    "PlanUpdate",
    "ProfilingTask",
    "RankRegistration",
    "RegisteredRank",
    "ReportAck",
    "TransferReport",
]
