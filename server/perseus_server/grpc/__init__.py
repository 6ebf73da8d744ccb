"""The gRPC adapter (``perseus.v1``): the servicer, the codec and the gate.

The codec is between protobuf and the service's plain values; the gate checks credentials and sizes
before a request is read. The only part of the server that speaks protobuf; it mirrors
:mod:`perseus_server.rest`.
"""
