"""``perseus_client.channels``: the channel a rank opens to one server address.

Against a real gRPC server on a free port of this machine (no service: only the connection is
checked). TLS to a resolved address, checked against the name it stands for, is
``test_addresses.py``'s (it needs a certificate made with ``openssl``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from perseus_client.addresses import Endpoint
from perseus_client.channels import open_channel


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    bound = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield bound
    server.stop(None)


@pytest.mark.parametrize("several", [False, True])
def test_a_plain_channel_connects(port: int, several: bool) -> None:
    channel = open_channel(
        Endpoint(f"127.0.0.1:{port}", False), root_certificates=None, several=several
    )
    try:
        grpc.channel_ready_future(channel).result(timeout=30)
    finally:
        channel.close()


def test_a_tls_channel_does_not_take_a_plain_server(port: int) -> None:
    channel = open_channel(
        Endpoint(f"127.0.0.1:{port}", True), root_certificates=None, several=False
    )
    try:
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=2)
    finally:
        channel.close()
