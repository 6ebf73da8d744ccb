"""``runtime/schema/versions/r0001_baseline.py``: the first revision, from any earlier version.

It runs the earlier history's missing steps (SQLite's 1 to 8, PostgreSQL's 1 to 2) and moves the
database onto the one schema both share; a database of a version newer than any of those steps is
refused, on both.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from perseus_server.domain.store import StoreError
from perseus_server.runtime import schema
from perseus_server.runtime.schema import legacy_postgres, legacy_sqlite
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.runtime.stores import engine_for
from perseus_server.testing.postgres import PostgresServer

from ....postgres_backend import database_for, postgres
from ....sqlite_backend import connect, set_user_version
from ..databases import sqlite_schema

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    set_user_version(path, 9)  # stamped by a server of before, newer than any of them
    with connect(path) as db:
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY)")
    with pytest.raises(StoreError, match="newer"):
        SqlStore.open(path)


@pytest.mark.parametrize("version", range(1, len(legacy_sqlite.STEPS) + 1))
def test_a_sqlite_file_of_any_earlier_version_reaches_the_new_database_s_schema(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / f"v{version}.db"
    engine = engine_for(path)
    try:
        with engine.connect() as conn:
            for step in legacy_sqlite.STEPS[:version]:
                step(conn)
        set_user_version(path, version)
        assert schema.migrate(engine) is None  # the baseline, from legacy version `version`
    finally:
        engine.dispose()
    SqlStore.open(tmp_path / "new.db").close()
    old, new = sqlite_schema(path), sqlite_schema(tmp_path / "new.db")
    assert sorted(old.pop("objects")) == sorted(new.pop("objects"))  # type: ignore[call-overload]
    assert old == new


def test_a_postgres_database_of_a_newer_version_is_refused(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE perseus_schema (version INTEGER NOT NULL)")
        conn.execute(f"INSERT INTO perseus_schema VALUES ({len(legacy_postgres.STEPS) + 1})")
    with pytest.raises(StoreError, match="newer"):
        SqlStore.open(url)
    with psycopg.connect(url) as conn:  # refused before anything was written
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    assert tables == [("perseus_schema",)]
