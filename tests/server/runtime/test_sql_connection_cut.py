"""The PostgreSQL store when its connections are cut.

A write is refused with the retryable ``StoreUnavailable`` (``database_unreachable``; gRPC
``UNAVAILABLE``, REST 503), counted, and nothing of it is committed; once the database can be
reached again the next write succeeds without a restart. A real PostgreSQL whose backends are
terminated by a superuser. And a leader hung in the middle of a transaction does not hold up
the next leader.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from perseus_server.domain.errors import StoreUnavailable
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.leadership import Lease, NotLeader
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.testing.postgres import PostgresServer

from ..postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def _terminate(url: str) -> int:
    """End every other connection to the database; how many were ended."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_write_on_a_cut_connection_is_refused_and_retryable(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    store = SqlStore.open(url, pool_size=1)
    refused: list[str] = []
    store.on_error = refused.append
    try:
        store.add_job("before", JobSpec(stages=2, microbatches=4))
        assert _terminate(url) >= 1  # the pool's connection, idle
        with pytest.raises(StoreUnavailable) as err, store.transaction():
            store.add_job("cut", JobSpec(stages=2, microbatches=4))
        assert err.value.kind == "database_unreachable" and err.value.retry_after > 0
        assert "nothing of this request was stored" in str(err.value)
        assert refused == ["database_unreachable"]
        store.add_job("after", JobSpec(stages=2, microbatches=4))  # the pool reconnected
        assert [j.id for j in store.jobs()] == ["before", "after"]  # "cut": not there
    finally:
        store.close()


def test_a_leader_hung_in_a_transaction_does_not_hold_up_the_next_epoch(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """A leader stopped between two statements of a transaction does not block the next one.

    Its transaction holds the epoch row, and the new epoch waits for it; PostgreSQL ends it
    after the fenced store's idle limit, so the standby takes over while the old one still
    hangs, and the hung write, when it resumes, is refused with nothing of it kept.
    """
    url = database_for(postgres, tmp_path)
    old, new = SqlStore.open(url, pool_size=1), SqlStore.open(url, pool_size=1)
    a, b = Lease(url, ttl=0.3, holder="a"), Lease(url, ttl=5.0, holder="b")
    resume = threading.Event()
    outcome: list[BaseException | None] = []

    def hung_write() -> None:
        try:
            with old.transaction():
                old.add_job("hung", JobSpec(stages=2, microbatches=4))
                resume.wait(60)  # stopped between two statements
                old.add_job("hung-2", JobSpec(stages=2, microbatches=4))
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    try:
        old.fence(a.try_acquire() or 0, idle_limit=0.5)
        writer = threading.Thread(target=hung_write)
        writer.start()
        time.sleep(0.4)  # a's lease has run out; its transaction is still open
        taken: list[int | None] = []
        taker = threading.Thread(target=lambda: taken.append(b.try_acquire()))
        taker.start()
        taker.join(30)  # a liveness guard: without the idle limit it waits for the resume
        assert taken == [2] and writer.is_alive(), "the new epoch waited for the hung leader"
        new.fence(2, idle_limit=5.0)
        resume.set()
        writer.join(30)
        assert isinstance(outcome[0], StoreUnavailable | NotLeader), outcome
        assert [j.id for j in new.jobs()] == []  # nothing of the hung transaction
    finally:
        resume.set()
        for x in (a, b):
            x.close()
        old.close()
        new.close()
