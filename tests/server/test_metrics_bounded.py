"""Metric labels come from bounded sets the server defines.

Invented HTTP methods, paths and gRPC method names, refused before authentication or not, never add
a series.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import httpx
import pytest

from perseus_server import ServerProcess

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("db") / "perseus.db", token=TOKEN) as srv:
        yield srv


def _series(text: str) -> set[str]:
    return {
        line.rsplit(" ", 1)[0]
        for line in text.splitlines()
        if line.startswith(("perseus_requests_total", "perseus_request_latency", "perseus_grpc"))
    }


def _raw(srv: ServerProcess, request: bytes) -> bytes:
    host, port = srv.http_url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _hostile_round(srv: ServerProcess, start: int, n: int) -> None:
    """``n`` requests and ``n`` gRPC calls with names no server defines, unauthenticated."""
    for i in range(start, start + n):
        _raw(srv, f"X{i}METHOD /nowhere/{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        _raw(srv, f"GET /invented/{i}?q={i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    with grpc.insecure_channel(srv.grpc_target) as ch:
        for i in range(start, start + n):
            for path in (f"/perseus.v1.PlanService/Made{i}", f"/evil{i}.Service/RegisterRank"):
                call = ch.unary_unary(path)
                with pytest.raises(grpc.RpcError) as e:
                    call(b"", timeout=10)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.slow
def test_invented_names_do_not_grow_the_series(secured: ServerProcess) -> None:
    http = httpx.Client(base_url=secured.http_url, headers=secured.headers, timeout=30)
    _hostile_round(secured, 0, 3)  # the 'other' series exist from here on
    assert http.get("/healthz").status_code == 200
    http.get("/metrics")
    before = http.get("/metrics").text
    _hostile_round(secured, 1000, 150)
    assert http.get("/healthz").status_code == 200
    after = http.get("/metrics").text
    assert _series(after) == _series(before)
    assert 'method="other"' in after and 'route="other"' in after
    assert "Made1" not in after and "evil" not in after and "X1000METHOD" not in after
    # a refused request on a real route is labelled with the route's template
    r = httpx.delete(secured.http_url + "/jobs/abc123", timeout=10)
    assert r.status_code == 401
    text = http.get("/metrics").text
    assert 'perseus_requests_total{method="DELETE",route="/jobs/{job_id}",status="401"}' in text
    assert "abc123" not in text
