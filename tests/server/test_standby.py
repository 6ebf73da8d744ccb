"""A standby answers on its ports, and ranks given both servers follow the leader.

Two real ``perseus serve`` processes on one real PostgreSQL database: the standby answers gRPC
calls ``UNAVAILABLE`` naming the leader (trailing metadata ``perseus-leader``), redirects REST
reads to the leader and refuses writes with ``503`` and ``Retry-After``, and its ``/healthz`` is
not ready (``503``, role ``standby``, the leader and the epoch). Then a real rank client given
both addresses (the standby first): it finds the leader, and when the leader is SIGKILLed it
receives a plan from the new leader on the same ports, versions never going back, its reports
acknowledged before and after, every acknowledged one stored; when the leader is SIGSTOPped, it
leaves it (keepalive) and reaches the new leader while the old one is still stopped.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import grpc
import httpx
import psycopg
import pytest

from perseus_client.addresses import ServerAddress
from perseus_client.measurements import IterationMeasurement
from perseus_client.transport import ServerLink
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_common.wire.values import PlanUpdate, RankRegistration
from perseus_server.testing.postgres import PostgresServer

from .conftest import leader_and_standby, make_job, solved_job, start_standby, wait_until
from .postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)

pytestmark = pytest.mark.slow


def test_the_standby_answers_naming_the_leader(postgres: PostgresServer, tmp_path: Path) -> None:
    url = database_for(postgres, tmp_path)
    a, b = leader_and_standby(url)
    try:
        a.start()
        with httpx.Client(base_url=a.http_url, timeout=30.0) as http:
            job_id = make_job(http)
            health = http.get("/healthz")
            leading = http.get("/metrics").text
        assert health.status_code == 200
        # What PerseusNoLeader reads: the leader says it leads, and in which epoch.
        assert "\nperseus_leader 1\n" in leading and "\nperseus_leader_epoch 1\n" in leading
        assert (health.headers["perseus-role"], health.headers["perseus-epoch"]) == ("leader", "1")
        start_standby(b)
        with httpx.Client(base_url=b.http_url, timeout=30.0) as http:
            h = http.get("/healthz")
            assert h.status_code == 503, h.text  # not ready: a Service sends nothing here
            doc = h.json()
            assert (doc["status"], doc["role"], doc["epoch"]) == ("standby", "standby", 1)
            assert doc["leader"]["grpc"] == a.grpc_target
            assert doc["leader"]["rest"] == a.http_url
            r = http.get(f"/jobs/{job_id}", params={"x": "1"})
            assert r.status_code == 307
            assert r.headers["location"] == f"{a.http_url}/jobs/{job_id}?x=1"
            w = http.post("/jobs", json={"stages": 2, "microbatches": 4})
            assert w.status_code == 503
            assert w.headers["retry-after"].isdigit()
            assert w.headers["content-type"].startswith("application/problem+json")
            assert w.json()["leader"]["rest"] == a.http_url
            # A client that follows the redirect reads from the leader.
            followed = http.get(f"/jobs/{job_id}", follow_redirects=True)
            assert followed.status_code == 200 and followed.json()["id"] == job_id
        with grpc.insecure_channel(b.grpc_target) as channel:
            stub = pb_grpc.PlanServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.RegisterRank(
                    pb.RegisterRankRequest(job_id=job_id, global_rank=0, hostname="t"), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert a.grpc_target in err.value.details()
            trailing = dict(err.value.trailing_metadata() or ())
            assert trailing["perseus-leader"] == a.grpc_target
            assert trailing["perseus-role"] == "standby"
    finally:
        for srv in (a, b):
            srv.stop()


def _stored_iterations(url: str, rank_id: str) -> set[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT iteration FROM iterations WHERE rank_id = %s", (rank_id,)
        ).fetchall()
    return {int(r[0]) for r in rows}


class _Rank:
    """A real rank's link given both addresses, reporting one iteration every 50 ms."""

    def __init__(self, job_id: str, addresses: list[str], report: bool = True) -> None:
        self.plans: list[tuple[int, str]] = []  # (version, the server it came from)
        ident = RankRegistration(job_id, 0, 0, 0, 0, "NVIDIA A40", (), "test")
        self.link = ServerLink(
            [ServerAddress(t, False) for t in addresses],
            ident,
            self._plan,
            report_interval=0.05,
            backoff_initial=0.05,
            backoff_max=1.0,
        )
        self.submitted = 0
        self.report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _plan(self, plan: PlanUpdate) -> None:
        self.plans.append((plan.version, self.link.target))

    def _run(self) -> None:
        while self.report and not self._stop.wait(0.05):
            self.link.submit(IterationMeasurement(self.submitted, 0.1, 0, 1.0, ()))
            self.submitted += 1

    def start(self) -> None:
        self.link.start()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.link.close()


def test_a_rank_given_both_servers_follows_the_leader_through_a_failover(
    postgres: PostgresServer, tmp_path: Path, small_csv: str
) -> None:
    url = database_for(postgres, tmp_path)
    a, b = leader_and_standby(url)
    rank: _Rank | None = None
    try:
        a.start()
        with httpx.Client(base_url=a.http_url, timeout=30.0) as http:
            job_id = solved_job(http, small_csv)
        waiting = start_standby(b)
        rank = _Rank(job_id, [b.grpc_target, a.grpc_target])  # the standby first
        rank.start()
        wait_until(lambda: rank.plans and rank.link.connected, "a plan from the leader")
        assert rank.plans[0][1] == a.grpc_target  # the standby named it
        assert rank.link.leader_hint == a.grpc_target
        wait_until(lambda: rank.link.reports_sent >= 5, "reports acknowledged by the leader")
        before = rank.plans[-1][0]
        got_before = len(rank.plans)
        a.kill()
        waiting.join(60)  # b's start() returns once it leads and is healthy
        assert "perseus: leader (epoch 2" in b.output(), b.output()
        wait_until(
            lambda: any(t == b.grpc_target for _, t in rank.plans[got_before:]),
            "a plan from the new leader",
        )
        sent_after_failover = rank.link.reports_sent
        wait_until(
            lambda: rank.link.reports_sent >= sent_after_failover + 5, "reports acknowledged"
        )
        # A new plan version from the new leader reaches the rank too.
        with httpx.Client(base_url=b.http_url, timeout=30.0) as http:
            r = http.put(f"/jobs/{job_id}/plan", json={"slowdown": 0.2})
            assert r.status_code == 200, r.text
            deployed = http.get(f"/jobs/{job_id}").json()["plan_version"]
        assert deployed > before
        wait_until(lambda: rank.plans[-1][0] == deployed, "the new leader's new plan version")
        versions = [v for v, _ in rank.plans]
        assert versions == sorted(versions), versions  # never backwards
        rank_id = rank.link.rank_id
        assert rank_id is not None
        acknowledged = rank.link.reports_sent
        rank.close()
        rank = None
        stored = _stored_iterations(url, rank_id)
        # Reports leave in order and are acknowledged in order: the first `acknowledged`
        # iterations were all acknowledged, by the old leader or the new, and none is lost.
        missing = set(range(acknowledged)) - stored
        assert not missing, sorted(missing)[:10]
    finally:
        if rank is not None:
            rank.close()
        for srv in (a, b):
            srv.stop()


def test_a_rank_leaves_a_hung_leader_while_it_is_still_stopped(
    postgres: PostgresServer, tmp_path: Path, small_csv: str
) -> None:
    """SIGSTOP, not SIGKILL: the leader's connections stay open and silent.

    The rank's keepalive notices, and it reaches the new leader before the old one resumes.
    """
    url = database_for(postgres, tmp_path)
    a, b = leader_and_standby(url)
    rank: _Rank | None = None
    stopped = False
    try:
        a.start()
        with httpx.Client(base_url=a.http_url, timeout=30.0) as http:
            job_id = solved_job(http, small_csv)
        waiting = start_standby(b)
        # No reports: nothing but the keepalive can tell the stream's silence from a hang.
        rank = _Rank(job_id, [a.grpc_target, b.grpc_target], report=False)
        rank.start()
        wait_until(lambda: rank.plans and rank.link.connected, "a plan from the leader")
        got_before = len(rank.plans)
        os.kill(a.pid, signal.SIGSTOP)
        stopped = True
        waiting.join(60)
        assert "perseus: leader (epoch 2" in b.output(), b.output()
        # Held stopped far longer than the keepalive (6 s + 3 s), shorter than gRPC's default
        # 60 s wait for a ping's answer: the rank must not need the old leader to come back.
        wait_until(
            lambda: any(t == b.grpc_target for _, t in rank.plans[got_before:]),
            "a plan from the new leader while the old one is stopped",
            timeout=45.0,
        )
        assert a.returncode is None  # still there, still stopped
        versions = [v for v, _ in rank.plans]
        assert versions == sorted(versions), versions
    finally:
        if stopped:
            os.kill(a.pid, signal.SIGCONT)
        if rank is not None:
            rank.close()
        for srv in (a, b):
            srv.stop()
