"""``runtime/schema/fresh_sql.py``: the generated head schema is current, and follows the history.

The module is written by ``scripts/gen_fresh_schema.py`` (the history run on a temporary SQLite
file and PostgreSQL database, its schema read back), never by hand. A revision added without a
regeneration fails :func:`test_committed_statements_are_current`, naming the command; a scratch
revision shows the generator picking up a new column on both databases.
"""

from __future__ import annotations

import ast
import importlib.util
import runpy
import sqlite3
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

from perseus_server.runtime import schema
from perseus_server.runtime.schema import fresh, fresh_sql
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.testing.postgres import PostgresServer

from ...postgres_backend import database_for, postgres
from .databases import SCRATCH, by_history, history_with, pg_dump, sqlite_schema

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)

ROOT = Path(__file__).resolve().parents[4]
COMMAND = "python scripts/gen_fresh_schema.py"


def generator() -> ModuleType:
    path = ROOT / "scripts" / "gen_fresh_schema.py"
    spec = importlib.util.spec_from_file_location("gen_fresh_schema", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_statements_are_current(postgres: PostgresServer, tmp_path: Path) -> None:
    written = generator().generate(tmp_path, postgres)
    new = runpy.run_path(str(written))
    stale = f"{fresh_sql.__file__} is stale; run `{COMMAND}`"
    assert new["REVISION"] == fresh_sql.REVISION, stale
    assert new["SQLITE"] == fresh_sql.SQLITE, stale
    if new["POSTGRES_MAJOR"] != fresh_sql.POSTGRES_MAJOR:
        # Another PostgreSQL's pg_dump spells the same schema its own way: what counts, that the
        # statements make the history's schema, test_fresh.py checks with this server's pg_dump.
        return
    assert written.read_text() == Path(fresh_sql.__file__).read_text(), stale


def test_the_generated_schema_is_the_head_s() -> None:
    """A revision added to the history needs a regeneration (until then ``fresh`` declines)."""
    assert fresh_sql.REVISION == fresh.REVISION == schema.head()
    assert not fresh.create(sqlite3.connect(":memory:"), False, "9999")


def test_the_generated_module_is_plain_data() -> None:
    tree = ast.parse(Path(fresh_sql.__file__).read_text())
    kinds = {type(node).__name__ for node in tree.body[1:]}  # after the docstring
    assert kinds <= {"Assign", "AnnAssign"}, kinds  # no import: neither Alembic nor SQLAlchemy
    assert "do not edit" in (ast.get_docstring(tree) or "") and COMMAND in ast.get_docstring(tree)
    assert any(s.startswith("CREATE TABLE jobs") for s in fresh_sql.SQLITE)
    assert any(s.startswith("CREATE TABLE jobs") for s in fresh_sql.POSTGRES)


def test_seeded_times_are_the_new_database_s_own(postgres: PostgresServer, tmp_path: Path) -> None:
    """The history seeds ``now``: so do the generated rows (not the generator's run time)."""
    before = time.time()
    SqlStore.open(tmp_path / "new.db").close()
    url = database_for(postgres, tmp_path)
    SqlStore.open(url).close()
    after = time.time()
    with sqlite3.connect(tmp_path / "new.db") as db:
        (created,) = db.execute("SELECT created FROM tenants WHERE id = 'default'").fetchone()
    assert int(before) <= created <= after
    with psycopg.connect(url) as conn:
        row: Any = conn.execute(
            "SELECT t.created, extract(epoch FROM e.since)::float8 FROM tenants t, perseus_epoch e"
        ).fetchone()
    assert before - 1 <= row[0] <= after + 1 and before - 1 <= row[1] <= after + 1


def run_all(statements: tuple[str, ...], execute: Any) -> None:
    for statement in (*statements, f"INSERT INTO alembic_version VALUES ('{SCRATCH}')"):
        execute(statement)


def test_a_new_revision_s_column_is_generated_for_both_databases(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    location = history_with(tmp_path, "op.add_column('jobs', sa.Column('scratch_note', sa.Text))")
    new = runpy.run_path(str(generator().generate(tmp_path / "out", postgres, location)))
    assert new["REVISION"] == SCRATCH
    # SQLite: the generated statements make the file the scratch history makes.
    db = sqlite3.connect(tmp_path / "made.db", isolation_level=None)
    run_all(new["SQLITE"], db.execute)
    db.close()
    by_history(tmp_path / "history.db", location)
    made, migrated = sqlite_schema(tmp_path / "made.db"), sqlite_schema(tmp_path / "history.db")
    assert made == migrated
    assert any(
        s.startswith("CREATE TABLE jobs") and "scratch_note TEXT" in s for s in new["SQLITE"]
    )
    # PostgreSQL: the same, by pg_dump.
    made_url = database_for(postgres, tmp_path / "made")
    history_url = database_for(postgres, tmp_path / "history")
    with psycopg.connect(made_url, autocommit=True) as conn, conn.transaction():
        run_all(new["POSTGRES"], conn.execute)
    by_history(history_url, location)
    assert pg_dump(made_url) == pg_dump(history_url)
    assert "scratch_note text" in pg_dump(made_url)
