"""Active/standby on one PostgreSQL database.

One lease holder at a time, a new epoch only once the lease expired, and fencing: a deposed leader's
writes are refused (nothing written), while a write in flight when the epoch moves on finishes first
and is seen by the new leader. Then two real ``perseus serve`` processes: the standby takes over
when the leader is killed, and a leader stopped past its lease stops itself when it resumes, writing
nothing.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from perseus_server import ServerProcess
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.leadership import DEPOSED_EXIT, Lease, LeaseKeeper, NotLeader
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.testing.postgres import PostgresServer

from ..conftest import solved_job
from ..postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def _spec() -> JobSpec:
    return JobSpec(stages=2, microbatches=4)


def test_a_deposed_leader_cannot_write(postgres: PostgresServer, tmp_path: Path) -> None:
    url = database_for(postgres, tmp_path)
    a_store, b_store = SqlStore.open(url), SqlStore.open(url)
    a, b = Lease(url, ttl=0.4, holder="a"), Lease(url, ttl=5.0, holder="b")
    try:
        assert a.try_acquire() == 1
        assert a.holds()
        a_store.fence(1)
        assert b.try_acquire() is None  # a's lease runs
        assert b.leader() == ("a", 1, True)
        a_store.add_job("by-a", _spec())
        time.sleep(0.5)  # a stops renewing (hung, cut off): its lease runs out
        assert not a.holds()  # a knows it by its own clock, before any query
        assert b.try_acquire() == 2
        b_store.fence(2)
        with pytest.raises(NotLeader, match="no longer the leader") as refused:
            a_store.add_job("late", _spec())
        assert refused.value.status == 503 and refused.value.retry_after > 0  # never a 500
        with pytest.raises(NotLeader), a_store.transaction():
            a_store.put_profile("by-a", "csv", "upload")
        assert a.renew() is False  # and it learns it is deposed
        b_store.add_job("by-b", _spec())
        assert [j.id for j in b_store.jobs()] == ["by-a", "by-b"]
        assert b_store.profile("by-a") is None
        assert a.try_acquire() is None  # b's lease runs
    finally:
        for x in (a, b):
            x.close()
        a_store.close()
        b_store.close()


def test_a_new_epoch_waits_for_the_writes_of_the_old_one(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    old, new = SqlStore.open(url), SqlStore.open(url)
    a, b = Lease(url, ttl=0.2, holder="a"), Lease(url, ttl=5.0, holder="b")
    got: list[int | None] = []
    try:
        old.fence(a.try_acquire() or 0)
        time.sleep(0.3)  # the lease has expired, but a write of the old epoch is under way
        with old.transaction():
            old.add_job("in-flight", _spec())
            taker = threading.Thread(target=lambda: got.append(b.try_acquire()))
            taker.start()
            taker.join(0.5)
            assert taker.is_alive()  # the new epoch waits for this transaction
        taker.join(10)
        assert got == [2]
        new.fence(2)
        assert [j.id for j in new.jobs()] == ["in-flight"]  # committed before epoch 2 began
    finally:
        for x in (a, b):
            x.close()
        old.close()
        new.close()


def test_the_keeper_renews_and_says_when_the_lease_is_lost(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    SqlStore.open(url).close()  # the schema
    a, b = Lease(url, ttl=0.6, holder="a"), Lease(url, ttl=5.0, holder="b")
    lost: list[str] = []
    try:
        assert a.try_acquire() == 1
        keeper = LeaseKeeper(a, lost.append).start()
        time.sleep(1.0)  # longer than the lease: kept alive by renewals
        assert b.try_acquire() is None and lost == []
        keeper.stop()
        time.sleep(0.7)
        assert b.try_acquire() == 2
        again = LeaseKeeper(a, lost.append).start()
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        again.stop()
        assert lost and "taken over" in lost[0]
    finally:
        a.close()
        b.close()


def _start_in_thread(srv: ServerProcess) -> threading.Thread:
    t = threading.Thread(target=srv.start, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_the_standby_takes_over_and_a_resumed_leader_stops(
    postgres: PostgresServer, tmp_path: Path, small_csv: str
) -> None:
    url = database_for(postgres, tmp_path)
    lease = ["--leader-lease", "1.5"]
    a, b = ServerProcess(url, extra_args=lease), ServerProcess(url, extra_args=lease)
    c = ServerProcess(url, extra_args=lease)
    try:
        a.start()
        assert "perseus: leader (epoch 1" in a.output()
        with httpx.Client(base_url=a.http_url, timeout=30.0) as http:
            job_id = solved_job(http, small_csv)
            version = http.get(f"/jobs/{job_id}").json()["plan_version"]
        waiting = _start_in_thread(b)
        deadline = time.monotonic() + 30
        while "perseus: standby" not in b.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "perseus: standby (the leader is" in b.output()
        assert "perseus: ready" not in b.output()  # a standby answers, but does not serve
        a.kill()
        killed = time.monotonic()
        waiting.join(60)
        took = time.monotonic() - killed
        assert "perseus: leader (epoch 2" in b.output(), b.output()
        assert took < 30, took  # generous: the lease (1.5 s) plus a start on a loaded machine
        with httpx.Client(base_url=b.http_url, timeout=30.0) as http:
            assert http.get(f"/jobs/{job_id}").json()["plan_version"] == version

        # b hangs past its lease: c takes over; b, resumed, stops itself, writing nothing.
        waiting = _start_in_thread(c)
        while "perseus: standby" not in c.output() and time.monotonic() < deadline + 30:
            time.sleep(0.1)
        os.kill(b.pid, signal.SIGSTOP)
        waiting.join(60)
        assert "perseus: leader (epoch 3" in c.output(), c.output()
        os.kill(b.pid, signal.SIGCONT)
        resumed = time.monotonic()
        while b.returncode is None and time.monotonic() - resumed < 30:
            time.sleep(0.1)
        assert b.returncode == DEPOSED_EXIT, b.output()
        assert re.search(r"lost the leadership \(the lease was taken over", b.output())
        with httpx.Client(base_url=c.http_url, timeout=30.0) as http:
            assert http.get(f"/jobs/{job_id}").json()["plan_version"] == version
    finally:
        for srv in (a, b, c):
            srv.stop()
