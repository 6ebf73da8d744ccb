"""The PostgreSQL store when its connections are cut: a write is refused with the retryable
``StoreUnavailable`` (``database_unreachable``; gRPC ``UNAVAILABLE``, REST 503), counted, and
nothing of it is committed; once the database can be reached again the next write succeeds
without a restart. A real PostgreSQL whose backends are terminated by a superuser."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from perseus_server.domain.errors import StoreUnavailable
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.postgres_store import PostgresStore
from perseus_server.testing.postgres import PostgresServer

from .postgres_backend import database_for, postgres

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
    store = PostgresStore.open(url, pool_size=1)
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
