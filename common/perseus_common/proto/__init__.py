"""Generated gRPC stubs of the Perseus plan-push protocol (``perseus.v1``).

Import as ``from perseus_common.proto import perseus_pb2, perseus_pb2_grpc``. The stubs are
generated from ``perseus.proto`` by ``scripts/gen_proto.py``; do not edit them by hand.
"""
