"""The gRPC adapter (``perseus.v1``): the methods, the servicer built from them and the gate.

Each method is declared once (:mod:`.methods`: its rule, checks, size limit and body); requests are
decoded and answers encoded by the shared codec (:mod:`perseus_common.wire.codec`), large reports
into columns (:mod:`.report_decoder`) and each plan serialized once (:mod:`.plan_encoder`); the
gate checks credentials and sizes before a request is read. The only part of the server that
speaks protobuf; it mirrors :mod:`perseus_server.rest`.
"""
