"""Request framing and slow bodies, with raw sockets against a real server.

The usual request smuggling variants (CL.TE, TE.CL, duplicate and malformed ``Transfer-Encoding``)
are refused with one 400 and a closed connection, so nothing behind them is answered as a second
request; body limits count what arrives whatever the framing; a body trickled a byte at a time is
cut off, and ``/healthz`` answers while such connections fight over ``--max-connections``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from perseus_server import ServerProcess

pytestmark = pytest.mark.slow

CAP = 16


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--max-connections", str(CAP), "--header-timeout", "2", "--body-timeout", "3"]
    with ServerProcess(tmp_path_factory.mktemp("db") / "perseus.db", extra_args=args) as s:
        yield s


def _addr(srv: ServerProcess) -> tuple[str, int]:
    host, port = srv.http_url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


def _exchange(srv: ServerProcess, raw: bytes, wait: float = 5.0) -> tuple[bytes, bool]:
    """Send ``raw``; everything answered within ``wait`` s, and whether the server closed."""
    with socket.create_connection(_addr(srv), timeout=wait) as s:
        s.sendall(raw)
        data, closed = b"", False
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            data += chunk
        return data, closed


HOST = b"Host: 127.0.0.1\r\n"
BEHIND = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"

SMUGGLED = {
    "CL.TE": b"POST /jobs HTTP/1.1\r\n" + HOST + b"Content-Length: " + str(5 + len(BEHIND)).encode()
    + b"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + BEHIND,
    "TE.CL": b"POST /jobs HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\nContent-Length: 3"
    + b"\r\n\r\n" + f"{len(BEHIND):x}".encode() + b"\r\n" + BEHIND + b"\r\n0\r\n\r\n" + BEHIND,
    "duplicate TE": b"POST /jobs HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n"
    + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + BEHIND,
    "TE list": b"POST /jobs HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked, identity\r\n\r\n"
    + b"0\r\n\r\n" + BEHIND,
    "TE unknown": b"POST /jobs HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: xchunked\r\n\r\n"
    + b"0\r\n\r\n" + BEHIND,
    "TE folded": b"POST /jobs HTTP/1.1\r\n" + HOST + b"Transfer-Encoding:\r\n chunked\r\n\r\n"
    + b"0\r\n\r\n" + BEHIND,
    "conflicting CL": b"POST /jobs HTTP/1.1\r\n" + HOST + b"Content-Length: 0\r\nContent-Length: 5"
    + b"\r\n\r\n" + BEHIND,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SMUGGLED))
def test_ambiguous_framing_is_one_400_and_a_closed_connection(
    srv: ServerProcess, name: str
) -> None:
    data, closed = _exchange(srv, SMUGGLED[name])
    assert data.count(b"HTTP/1.1 ") == 1, data  # nothing behind it is answered
    assert data.startswith(b"HTTP/1.1 400 "), data
    assert closed


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(srv: ServerProcess) -> None:
    chunk = b"x" * 65536
    body = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * 80  # 5 MiB > 4 MiB
    raw = b"POST /jobs HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n" + body
    with socket.create_connection(_addr(srv), timeout=10) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(raw)  # refused and closed while the rest is on its way
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 413 "), data[:200]
    assert b'"field":"body"' in data


def _trickle(srv: ServerProcess, stop: threading.Event, closed: list[float]) -> None:
    """Headers, then a body one byte every 0.2 s; records when the server closed it."""
    t0 = time.monotonic()
    try:
        s = socket.create_connection(_addr(srv), timeout=30)
    except OSError:
        closed.append(0.0)
        return
    with s:
        try:
            s.sendall(b"POST /jobs HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
                      b"Content-Length: 100000\r\n\r\n")  # fmt: skip
            s.settimeout(0.2)
            while not stop.is_set():
                s.sendall(b" ")
                try:
                    if s.recv(4096) == b"":
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass
    if not stop.is_set():
        closed.append(time.monotonic() - t0)


def test_slow_bodies_are_cut_off_and_health_answers_meanwhile(srv: ServerProcess) -> None:
    stop = threading.Event()
    closed: list[float] = []
    threads = [
        threading.Thread(target=_trickle, args=(srv, stop, closed), daemon=True)
        for _ in range(CAP + 4)
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # every slot now holds a trickling body
        answered = 0
        for _ in range(5):
            try:
                r = httpx.get(srv.http_url + "/healthz", timeout=5)
                answered += r.status_code == 200
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert answered == 5
        deadline = time.monotonic() + 60
        while len(closed) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.2)
        # every trickler was closed by the server (none lasted until the test stopped it)
        assert len(closed) == len(threads)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
    assert httpx.get(srv.http_url + "/healthz", timeout=5).status_code == 200


def test_a_request_head_is_bounded(srv: ServerProcess) -> None:
    """A request line and headers past :data:`MAX_HEAD_BYTES` are refused.

    One 400, the connection closed, whether sent at once or a piece at a time; a head just under
    it is answered.
    """
    from perseus_server.runtime.connection_limits import MAX_HEAD_BYTES

    def head(size: int) -> bytes:
        start = b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-Pad: "
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    data, closed = _exchange(srv, head(MAX_HEAD_BYTES - 512) + BEHIND)
    assert data.count(b"HTTP/1.1 200 ") == 2, data[:300]  # and the request behind it
    data, closed = _exchange(srv, head(MAX_HEAD_BYTES + 1024) + BEHIND)
    assert data.startswith(b"HTTP/1.1 400 ") and data.count(b"HTTP/1.1 ") == 1, data[:300]
    assert closed
    # Never finished: an endless header, a kilobyte at a time.
    with socket.create_connection(_addr(srv), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-Pad: ")
        answer = b""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(2 * MAX_HEAD_BYTES // 1024):
                s.sendall(b"a" * 1024)
                time.sleep(0.001)
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
