"""``runtime/schema/fresh.py``: a new database's schema written directly is the history's.

A store opening a database that holds nothing writes the head's schema itself
(:mod:`perseus_server.runtime.schema.fresh`, from the generated
:mod:`~perseus_server.runtime.schema.fresh_sql`) instead of running the history with Alembic.
These tests build one database each way, on SQLite and on PostgreSQL, and compare everything the
schema is: the tables, columns, types, defaults, constraints and indexes (SQLite's own DDL text,
in creation order; PostgreSQL's ``pg_dump --schema-only``), the rows the history seeds, and the
version stamps; and they check the lock, and that the direct path loads neither Alembic nor
SQLAlchemy. That the generated statements are current: ``test_fresh_sql.py``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from perseus_server.runtime import schema
from perseus_server.runtime.schema import fresh
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.testing.postgres import PostgresServer

from ...postgres_backend import database_for, postgres
from ...sqlite_backend import connect
from ...store_fixture import sqlite_copy
from .databases import by_history, pg_dump, postgres_rows, sqlite_schema

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def test_sqlite_new_database_is_the_history_s_schema(tmp_path: Path) -> None:
    SqlStore.open(tmp_path / "fresh.db").close()
    by_history(tmp_path / "history.db")
    made, migrated = sqlite_schema(tmp_path / "fresh.db"), sqlite_schema(tmp_path / "history.db")
    assert made == migrated
    assert migrated["alembic_version"] == [(schema.head(),)]
    assert len(migrated["objects"]) > 30  # type: ignore[arg-type]


def test_postgres_new_database_is_the_history_s_schema(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    made = database_for(postgres, tmp_path / "fresh")
    migrated = database_for(postgres, tmp_path / "history")
    SqlStore.open(made).close()
    by_history(migrated)
    dumped = pg_dump(migrated)
    assert "CREATE TABLE public.perseus_lease" in dumped
    assert pg_dump(made) == dumped
    assert postgres_rows(made) == postgres_rows(migrated)
    assert postgres_rows(made)["alembic_version"] == [(schema.head(),)]


_LOADS = """
import sys
from perseus_server.runtime.sql_store import SqlStore
SqlStore.open(sys.argv[1]).close()
print(sorted(m for m in ("alembic", "sqlalchemy") if m in sys.modules))
"""


def loaded_opening(target: Path) -> str:
    run = subprocess.run(
        [sys.executable, "-c", _LOADS, str(target)], check=True, capture_output=True, text=True
    )
    return run.stdout.strip()


def test_opening_a_new_or_current_database_loads_neither_alembic_nor_sqlalchemy(
    tmp_path: Path,
) -> None:
    assert loaded_opening(tmp_path / "new.db") == "[]"  # created directly
    assert loaded_opening(tmp_path / "new.db") == "[]"  # at the head: one query
    old = sqlite_copy(tmp_path / "old.db")  # written by the stores of before: the history runs
    assert loaded_opening(old) == "['alembic', 'sqlalchemy']"


def test_a_database_holding_anything_is_left_to_the_history(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with connect(path) as db:
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY)")  # a first-release file, half made
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert not fresh.create(conn, False, schema.head())
        assert not fresh.create(sqlite3.connect(":memory:"), False, "9999")  # not our head
    finally:
        conn.close()
    with connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert tables == ["jobs"]


def test_stores_opening_one_new_database_at_once_create_it_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _LOADS, str(path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    assert all(r.wait(timeout=120) == 0 for r in runs)
    for r in runs:
        assert r.stdout is not None
        r.stdout.close()
    by_history(tmp_path / "history.db")
    assert sqlite_schema(path) == sqlite_schema(tmp_path / "history.db")
