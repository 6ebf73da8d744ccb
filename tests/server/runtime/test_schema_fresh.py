"""A new database's schema written directly is the one the migration history leaves.

A store opening a database that holds nothing writes the head's schema itself
(:mod:`perseus_server.runtime.schema.fresh`) instead of running the history with Alembic. These
tests build one database each way, on SQLite and on PostgreSQL, and compare everything the
schema is: the tables, columns, types, defaults, constraints and indexes (SQLite's own DDL text,
PostgreSQL's ``pg_dump --schema-only``), the rows the history seeds, and the version stamps.
A revision added to the history without its schema written in ``fresh.py`` fails here.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg

from perseus_server.runtime import schema
from perseus_server.runtime.schema import fresh
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.runtime.stores import engine_for
from perseus_server.testing.postgres import PostgresServer, postgres_binaries

from ..postgres_backend import database_for, postgres
from ..sqlite_backend import connect
from ..store_fixture import sqlite_copy

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def by_history(target: str | Path) -> None:
    """Migrate the (empty) database ``target`` names with Alembic: ``upgrade head``."""
    engine = engine_for(target, pool_size=1)
    try:
        assert schema.migrate(engine) is None
    finally:
        engine.dispose()


def sqlite_ddl(text: str | None) -> str | None:
    """SQLite's stored DDL without the layout: whitespace and identifier quotes."""
    if text is None:
        return None
    flat = re.sub(r"\s+", " ", text.replace('"', ""))
    return re.sub(r"\s*([(),])\s*", r"\1", flat).strip()


def sqlite_schema(path: Path) -> dict[str, object]:
    with connect(path) as db:
        return {
            "objects": sorted(
                (kind, name, table, sqlite_ddl(sql))
                for kind, name, table, sql in db.execute(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master"
                )
            ),
            "user_version": db.execute("PRAGMA user_version").fetchone(),
            "alembic_version": db.execute("SELECT * FROM alembic_version").fetchall(),
            "tenants": db.execute(
                "SELECT id, typeof(created), max_jobs, max_gpus, weight, guaranteed_watts "
                "FROM tenants"
            ).fetchall(),
            "leadership": db.execute(
                "SELECT (SELECT count(*) FROM perseus_lease), (SELECT count(*) FROM perseus_epoch)"
            ).fetchall(),
        }


def test_sqlite_new_database_is_the_history_s_schema(tmp_path: Path) -> None:
    SqlStore.open(tmp_path / "fresh.db").close()
    by_history(tmp_path / "history.db")
    made, migrated = sqlite_schema(tmp_path / "fresh.db"), sqlite_schema(tmp_path / "history.db")
    assert made == migrated
    assert migrated["alembic_version"] == [(schema.head(),)]
    assert len(migrated["objects"]) > 30  # type: ignore[arg-type]


def pg_dump(pg: PostgresServer, url: str) -> str:
    binaries = postgres_binaries()
    assert binaries is not None
    out = subprocess.run(
        [
            str((binaries / "initdb").resolve().parent / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "-d",
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # pg_dump's \restrict line carries a random key per dump: the only line that is not schema.
    return "\n".join(line for line in out.splitlines() if not line.startswith("\\"))


def postgres_rows(url: str) -> dict[str, object]:
    with psycopg.connect(url) as conn:
        return {
            "perseus_schema": conn.execute("SELECT * FROM perseus_schema").fetchall(),
            "alembic_version": conn.execute("SELECT * FROM alembic_version").fetchall(),
            "tenants": conn.execute(
                "SELECT id, max_jobs, max_gpus, weight, guaranteed_watts FROM tenants"
            ).fetchall(),
            "lease": conn.execute(
                "SELECT id, holder, expires::text, advertise FROM perseus_lease"
            ).fetchall(),
            "epoch": conn.execute("SELECT id, epoch, holder FROM perseus_epoch").fetchall(),
        }


def test_postgres_new_database_is_the_history_s_schema(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    made = database_for(postgres, tmp_path / "fresh")
    migrated = database_for(postgres, tmp_path / "history")
    SqlStore.open(made).close()
    by_history(migrated)
    dumped = pg_dump(postgres, migrated)
    assert "CREATE TABLE public.perseus_lease" in dumped
    assert pg_dump(postgres, made) == dumped
    assert postgres_rows(made) == postgres_rows(migrated)
    assert postgres_rows(made)["alembic_version"] == [(schema.head(),)]


def test_the_written_schema_is_the_head_s() -> None:
    """A revision added to the history needs its schema in ``fresh.py`` too (else declined)."""
    assert fresh.REVISION == schema.head()


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
        assert not fresh.create(sqlite3.connect(":memory:"), False, "0002")  # not our head
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
