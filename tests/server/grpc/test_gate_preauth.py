"""Nothing before authentication, and connections bounded.

Unauthenticated gRPC bodies are not read, per-method sizes are enforced, connections that never
finish their headers are closed, the descriptor limit is raised, the server refuses unsafe listening
setups, and repeated log lines are rate-limited.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("db") / "perseus.db"
    args = ["--header-timeout", "1", "--max-connections", "400"]
    with ServerProcess(db, token=TOKEN, extra_args=args) as srv:
        yield srv


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_unauthenticated_grpc_bodies_are_not_read(guarded: ServerProcess) -> None:
    before = rss_mib(guarded.pid)
    big = pb.RegisterRankRequest(job_id="x", gpu_name="g" * (15 * 1024 * 1024))
    opts = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    for _ in range(12):
        with grpc.insecure_channel(guarded.grpc_target, options=opts) as ch:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.PlanServiceStub(ch).RegisterRank(big, timeout=30)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Twelve parsed 15 MiB bodies would add far more than this.
    assert rss_mib(guarded.pid) - before < 120


def test_registration_has_a_small_size_limit(guarded: ServerProcess) -> None:
    with grpc.insecure_channel(guarded.grpc_target) as ch, pytest.raises(grpc.RpcError) as e:
        pb_grpc.PlanServiceStub(ch).RegisterRank(
            pb.RegisterRankRequest(job_id="x", hostname="h" * 100_000),
            metadata=guarded.grpc_metadata,
            timeout=30,
        )
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.details().startswith("request")


def test_half_sent_headers_are_closed_and_health_goes_on(guarded: ServerProcess) -> None:
    host, port = guarded.http_url.rsplit("/", 1)[-1].rsplit(":", 1)
    socks = []
    for _ in range(600):  # more than --max-connections
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        socks.append(s)
    try:
        deadline = time.monotonic() + 60
        ok = False
        while time.monotonic() < deadline and not ok:
            try:
                ok = httpx.get(guarded.http_url + "/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.2)
        assert ok, "/healthz never answered while half-open connections were held"
        # The server closed them, instead of holding a descriptor each forever: an EOF, or a
        # reset when it closed one before reading the half-sent bytes (the kernel answers a
        # close with unread data by RST; which one depends on when the cap closed it).
        socks[0].settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            assert socks[0].recv(1) == b""
    finally:
        for s in socks:
            s.close()
    assert "Too many open files" not in guarded.output()


def test_the_descriptor_limit_is_raised(guarded: ServerProcess) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = Path(f"/proc/{guarded.pid}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    server_soft, server_hard = line.split()[3:5]
    assert server_soft == server_hard


def _serve(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "perseus_server", "--http-port", "0", "--grpc-port", "0"]
    cmd += ["--db", str(tmp_path / "x.db"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_no_token_on_a_public_address_is_refused(tmp_path: Path) -> None:
    r = _serve(["--host", "0.0.0.0"], tmp_path)
    assert r.returncode == 2 and "--insecure" in r.stderr, r.stderr


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    os.chmod(token, 0o644)
    r = _serve(["--token-file", str(token)], tmp_path)
    assert r.returncode == 2 and "chmod 600" in r.stderr, r.stderr
