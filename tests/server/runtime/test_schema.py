"""``runtime/schema/__init__.py``: the one migration history, run under the lock.

A new database gets the newest revision; a revision appended to the history runs once; a failing
one changes nothing. The earlier histories' upgrades are tested by their modules' names
(``schema/test_legacy_sqlite.py``, ``schema/test_legacy_postgres.py``), the first revision in
``schema/versions/test_r0001_baseline.py``, a new database's direct schema in
``schema/test_fresh.py``.
"""

from __future__ import annotations

from pathlib import Path

from perseus_server.runtime import schema
from perseus_server.runtime.schema import legacy_sqlite
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.runtime.stores import engine_for

from ..sqlite_backend import JOB, connect, first_release_database, user_version
from .schema.databases import SCRATCH, history_with, migrate_fails, revision_of


def test_new_database_gets_the_newest_revision(tmp_path: Path) -> None:
    SqlStore.open(tmp_path / "new.db").close()
    assert revision_of(tmp_path / "new.db") == schema.head()
    # A server of before reads a version newer than its own, and refuses the file.
    assert user_version(tmp_path / "new.db") == legacy_sqlite.MOVED


def test_an_appended_revision_runs_once(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    first_release_database(path)
    location = history_with(
        tmp_path,
        "op.add_column('jobs', sa.Column('scratch_note', sa.Text, nullable=False, server_default=''))",
    )
    engine = engine_for(path)
    try:
        assert schema.migrate(engine, location) is None
        assert schema.migrate(engine, location) == SCRATCH  # already there: nothing runs again
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT id, scratch_note FROM jobs").all() == [(JOB, "")]
    finally:
        engine.dispose()
    assert revision_of(path) == SCRATCH


def test_a_failing_revision_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    SqlStore.open(path).close()
    location = history_with(
        tmp_path,
        "op.create_table('half_done', sa.Column('a', sa.Integer))\n    raise RuntimeError('boom')",
    )
    migrate_fails(path, location)
    assert revision_of(path) == schema.head()
    with connect(path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "half_done" not in tables and "jobs" in tables
