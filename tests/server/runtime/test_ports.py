"""An ephemeral gRPC port is had on every address of the host, or not at all.

gRPC given ``localhost:0`` takes a port on ``[::1]`` and then asks for it on ``127.0.0.1``, where
another process may hold it: it then listened on ``[::1]`` alone, and a rank dialing
``127.0.0.1`` found nothing (a test that does so failed under load).
"""

from __future__ import annotations

import contextlib
import errno
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from perseus_server.runtime.ports import grpc_addresses, reserve_port


def _ipv6() -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        return True
    return False


def _bind_error(family: socket.AddressFamily, ip: str, port: int) -> int:
    """0 when a plain socket can bind ``ip:port``, else the errno."""
    with socket.socket(family) as s:
        try:
            s.bind((ip, port))
        except OSError as e:
            return e.errno or -1
    return 0


def test_localhost_is_both_loopbacks_and_a_wildcard_none() -> None:
    assert grpc_addresses("localhost")[:2] == [
        (socket.AF_INET6, "::1"),
        (socket.AF_INET, "127.0.0.1"),
    ]
    assert grpc_addresses("0.0.0.0") == grpc_addresses("::") == []
    assert reserve_port("127.0.0.1") is None  # one address: gRPC's own port 0 is enough


def test_the_port_is_held_on_every_loopback_until_released() -> None:
    if not _ipv6():
        pytest.skip("no IPv6 loopback here: localhost is one address")
    held = reserve_port("localhost")
    assert held is not None and held.port > 0 and len(held.sockets) == 2
    try:
        for family, ip in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
            assert _bind_error(family, ip, held.port) == errno.EADDRINUSE, ip
    finally:
        held.release()
    assert held.sockets == []


def test_grpc_listens_on_both_loopbacks_beside_the_holding_sockets() -> None:
    if not _ipv6():
        pytest.skip("no IPv6 loopback here: localhost is one address")
    held = reserve_port("localhost")
    assert held is not None
    # The server's options: no SO_REUSEPORT (two servers never share a port).
    server = grpc.server(ThreadPoolExecutor(1), options=[("grpc.so_reuseport", 0)])
    try:
        assert server.add_insecure_port(f"localhost:{held.port}") == held.port
        held.release()
        server.start()
        for family, ip in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
            with socket.socket(family) as s:
                s.connect((ip, held.port))  # refused if gRPC listened on one address
    finally:
        held.release()
        server.stop(0)
