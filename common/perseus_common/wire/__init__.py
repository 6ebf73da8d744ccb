"""The values a rank and the server exchange over ``perseus.v1``, written once for both ends.

* :mod:`perseus_common.wire.values` — frozen dataclasses that mirror the messages field for
  field (registration, plans, iteration reports with their transfers and applied-clock
  findings, acknowledgements); pure Python, no protobuf. A flat request that only its receiver
  reads needs none (its method reads the message);
* :mod:`perseus_common.wire.codec` — ``encode_*`` / ``decode_*`` for every message with a
  value: the rank client encodes what it sends and decodes what it receives, the server's gRPC
  adapter the other way round; the client builds or reads no message anywhere else.

Encoding is faithful: ``decode(encode(v)) == v`` for every value whose fields fit their proto
types (``tests/common/wire/test_values_round_trip.py``). What a value may hold (bounds, known
instruction names, supported clocks) is each end's business: the server checks it
(``perseus_server.domain.bounds``), the client clamps what it measured before encoding.

Import each name from its module (this package re-exports nothing): code that needs only the
values stays free of protobuf, which the codec loads.
"""
