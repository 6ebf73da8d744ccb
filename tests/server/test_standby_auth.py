"""A standby authenticates first; a leader whose lease lapsed answers nothing but 503.

Real ``perseus serve`` processes on one real PostgreSQL database:

- a standby with a token configured answers a call without a valid credential ``401`` (REST,
  ``WWW-Authenticate``) and ``UNAUTHENTICATED`` (gRPC), with nothing of the leader (its address,
  its holder, its epoch) anywhere in the answer, ``/healthz`` included; a valid credential, a
  configured token or one issued by the leader (read from the database), hears of the leader as
  before;
- a leader SIGSTOPped past its lease, while a standby took over and created a job, is sent a
  read of that job, a read of an older job, a write and a gRPC registration over connections
  it had accepted before it stopped: resumed, it answers each ``503`` / ``UNAVAILABLE`` (never
  a stale 404 or 200, never a 500), then stops with exit status 3.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime.leadership import DEPOSED_EXIT
from perseus_server.testing.postgres import PostgresServer

from .conftest import leader_and_standby, make_job, start_standby, wait_until
from .postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)

pytestmark = pytest.mark.slow

ADMIN = "the-admin-token"


def _hints(leader: ServerProcess) -> list[str]:
    """What would tell a caller of the leader: its addresses and ports."""
    host_port = leader.grpc_target
    rest = httpx.URL(leader.http_url)
    return [host_port, str(rest.port), str(host_port.rsplit(":", 1)[1]), "holder"]


def _no_hint(text: str, leader: ServerProcess) -> None:
    for hint in _hints(leader):
        assert hint not in text, f"{hint!r} in {text!r}"


def test_a_standby_authenticates_before_it_names_the_leader(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    a, b = leader_and_standby(url, token=ADMIN)
    try:
        a.start()
        with httpx.Client(base_url=a.http_url, timeout=30.0) as http:
            r = http.post(
                "/tenants", json={"id": "team-a"}, headers={"Authorization": f"Bearer {ADMIN}"}
            )
            assert r.status_code == 201, r.text
            r = http.post(
                "/credentials",
                json={"scope": "tenant", "tenant": "team-a"},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            issued = r.json()["credential"]
        start_standby(b)
        with httpx.Client(base_url=b.http_url, timeout=30.0) as http:
            for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                for method, path in (("POST", "/jobs"), ("GET", "/jobs/j1"), ("GET", "/metrics")):
                    r = http.request(method, path, headers=bad, json={})
                    where = f"{method} {path} {bad}: {r.status_code} {r.headers} {r.text}"
                    assert r.status_code == 401, where
                    assert r.headers["www-authenticate"] == "Bearer", where
                    assert r.json()["field"] == "Authorization", where
                    assert "perseus-leader" not in r.headers and "location" not in r.headers
                    _no_hint(str(r.headers) + r.text, a)
                h = http.get("/healthz", headers=bad)  # public: not ready, nothing of the leader
                assert h.status_code == 503 and h.json()["role"] == "standby", h.text
                assert h.json()["leader"] is None and h.json()["epoch"] is None, h.text
                _no_hint(str(h.headers) + h.text, a)
            for good in (ADMIN, issued):  # a configured token, and one the leader issued
                w = http.post("/jobs", json={}, headers={"Authorization": f"Bearer {good}"})
                assert w.status_code == 503, w.text
                assert w.json()["leader"]["rest"] == a.http_url
                r = http.get("/jobs/j1", headers={"Authorization": f"Bearer {good}"})
                assert r.status_code == 307 and r.headers["location"].startswith(a.http_url)
            h = http.get("/healthz", headers={"Authorization": f"Bearer {ADMIN}"})
            assert h.json()["leader"]["grpc"] == a.grpc_target
        with grpc.insecure_channel(b.grpc_target) as channel:
            stub = pb_grpc.PlanServiceStub(channel)
            request = pb.RegisterRankRequest(job_id="j1", global_rank=0, hostname="t")
            for md in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.RpcError) as err:
                    stub.RegisterRank(request, metadata=md, timeout=30)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value
                trailing = dict(err.value.trailing_metadata() or ())
                _no_hint(f"{err.value.details()} {trailing}", a)
                assert not trailing.get("perseus-leader")
            with pytest.raises(grpc.RpcError) as err:
                stub.RegisterRank(
                    request, metadata=(("authorization", f"Bearer {ADMIN}"),), timeout=30
                )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(err.value.trailing_metadata() or ())["perseus-leader"] == a.grpc_target
    finally:
        for srv in (a, b):
            srv.stop()


class _Held:
    """A connection the server accepted and answered once (kept alive); a request sent later."""

    def __init__(self, srv: ServerProcess) -> None:
        url = httpx.URL(srv.http_url)
        self.host = f"{url.host}:{url.port}"
        self.sock = socket.create_connection((url.host, url.port))
        self.sock.settimeout(120)  # a guard against a hang only
        self.send("GET", "/healthz")
        assert self.read()[0] == 200

    def send(self, method: str, path: str, body: bytes = b"") -> None:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)

    def read(self) -> tuple[int, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                return 0, data  # closed without an answer
            data += chunk
        top, _, body = data.partition(b"\r\n\r\n")
        size = next(
            (
                int(line.split(b":")[1])
                for line in top.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < size:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(top.split(b" ")[1]), body


def test_a_leader_resumed_past_its_lease_answers_503_until_it_stops(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    a, c = leader_and_standby(url)
    try:
        a.start()
        with httpx.Client(base_url=a.http_url, timeout=30.0) as http:
            old_job = make_job(http)
        waiting = start_standby(c)
        held = {name: _Held(a) for name in ("new", "old", "write")}
        channel = grpc.insecure_channel(a.grpc_target)
        stub = pb_grpc.PlanServiceStub(channel)
        with pytest.raises(grpc.RpcError):  # the channel connected: a call answered
            stub.WatchPlan(pb.WatchPlanRequest(job_id="none", rank_id="none"), timeout=30).next()
        os.kill(a.pid, signal.SIGSTOP)
        waiting.join(120)
        assert "perseus: leader (epoch 2" in c.output(), c.output()
        with httpx.Client(base_url=c.http_url, timeout=30.0) as http:
            new_job = make_job(http)
        # Sent while it is stopped, over connections it accepted before: read on resuming.
        held["new"].send("GET", f"/jobs/{new_job}")
        held["old"].send("GET", f"/jobs/{old_job}")
        held["write"].send("POST", "/jobs", b'{"stages": 2, "microbatches": 4}')
        codes: list[grpc.StatusCode] = []

        def register() -> None:
            try:
                stub.RegisterRank(
                    pb.RegisterRankRequest(job_id=new_job, global_rank=0, hostname="t"),
                    timeout=120,
                )
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())

        rpc = threading.Thread(target=register, daemon=True)
        rpc.start()
        time.sleep(0.5)  # the call is on its way (the stopped server cannot answer it)
        os.kill(a.pid, signal.SIGCONT)
        answers = {name: h.read() for name, h in held.items()}
        rpc.join(120)
        for name, (status, body) in answers.items():
            assert status == 503, f"{name}: {status} {body!r}"
            assert b"lease" in body, f"{name}: {body!r}"
        assert codes == [grpc.StatusCode.UNAVAILABLE], codes
        wait_until(lambda: a.returncode is not None, "the deposed leader to stop")
        assert a.returncode == DEPOSED_EXIT, a.output()
        channel.close()
        with httpx.Client(base_url=c.http_url, timeout=30.0) as http:  # nothing written by a
            jobs = http.get("/jobs").json()["jobs"]
            assert sorted(j["id"] for j in jobs) == sorted([old_job, new_job])
    finally:
        for srv in (a, c):
            srv.stop()
