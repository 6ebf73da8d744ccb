"""Both HTTP protocols ``perseus serve`` may run keep the connection guards.

The protocols are uvicorn's httptools one, and its h11 one where httptools is missing; the guards
are ``runtime/connection_limits.py``'s. On a real uvicorn on a real port: a request is answered, a
connection that sends nothing is closed after the header timeout, and a request head that goes on
past the bound is refused with the connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from perseus_server.runtime.connection_limits import MAX_HEAD_BYTES, guarded_h11, guarded_http

HEADER_TIMEOUT = 1.0


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=[guarded_http, guarded_h11], ids=["httptools", "h11"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    make: Callable[..., Any] = request.param
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        _app, http=make(16, HEADER_TIMEOUT, 2.0), lifespan="off", log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


def _talk(port: int, raw: bytes, wait: float = 5.0) -> tuple[bytes, bool]:
    """Send ``raw``; what came back within ``wait`` s and whether the server closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        if raw:
            s.sendall(raw)
        data = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return data, False
            except ConnectionResetError:
                return data, True
            if not chunk:
                return data, True
            data += chunk
        return data, False


def test_a_request_is_answered(port: int) -> None:
    data, _ = _talk(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", wait=0.5)
    assert data.startswith(b"HTTP/1.1 200 ") and b"\r\nok\r\n" in data, data


def test_a_silent_connection_is_closed_after_the_header_timeout(port: int) -> None:
    t0 = time.monotonic()
    data, closed = _talk(port, b"", wait=HEADER_TIMEOUT + 4)
    assert closed and data == b""
    assert time.monotonic() - t0 >= HEADER_TIMEOUT - 0.1


def test_an_endless_head_is_refused_and_closed(port: int) -> None:
    """A header that never ends, a kilobyte at a time: refused once past the bound."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(2 * MAX_HEAD_BYTES // 1024):
                s.sendall(b"a" * 1024)
                time.sleep(0.001)
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 4"), answer[:200]
