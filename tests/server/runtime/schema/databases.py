"""Helpers the schema modules' tests share: a database's revision, rows, schema, a history copy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from perseus_server.runtime import schema
from perseus_server.runtime.stores import engine_for
from perseus_server.testing.postgres import postgres_binaries

from ...sqlite_backend import connect
from ...store_fixture import COUNTS

__all__ = [
    "SCRATCH",
    "by_history",
    "counts",
    "history_with",
    "migrate_fails",
    "pg_dump",
    "postgres_rows",
    "revision_of",
    "sqlite_schema",
]

#: The revision id of the scratch revision :func:`history_with` appends.
SCRATCH = "scratch"

_SCRATCH = """\"""A scratch revision.\"""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down}"


def upgrade() -> None:
    {body}
"""


def revision_of(target: str | Path) -> str | None:
    """The Alembic revision the database has reached."""
    engine = engine_for(target, pool_size=1)
    try:
        with engine.connect() as conn:
            return schema.revision(conn)
    finally:
        engine.dispose()


def counts(target: str | Path) -> dict[str, int]:
    """Rows per table of :data:`COUNTS`."""
    engine = engine_for(target, pool_size=1)
    try:
        with engine.connect() as conn:
            return {
                t: int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {t}").scalar_one())
                for t in COUNTS
            }
    finally:
        engine.dispose()


def history_with(tmp_path: Path, body: str) -> Path:
    """A copy of the store's history with a scratch revision :data:`SCRATCH` doing ``body``.

    The scratch revision follows the head, whichever it is: a revision added to the history
    leaves these tests as they are.
    """
    location = tmp_path / "history"
    shutil.copytree(Path(schema.__file__).parent, location)
    (location / "versions" / "r0002_scratch.py").write_text(
        _SCRATCH.format(body=body, revision=SCRATCH, down=schema.head())
    )
    return location


def migrate_fails(path: Path, location: Path) -> None:
    """Migrating the database at ``path`` with the history at ``location`` raises ``boom``."""
    engine = engine_for(path)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            schema.migrate(engine, location)
    finally:
        engine.dispose()


def by_history(target: str | Path, location: Path | None = None) -> None:
    """Migrate the (empty) database ``target`` names with Alembic: ``upgrade head``."""
    engine = engine_for(target, pool_size=1)
    try:
        assert schema.migrate(engine, *([location] if location else [])) is None
    finally:
        engine.dispose()


def sqlite_schema(path: Path) -> dict[str, object]:
    """Everything a SQLite file's schema is: its objects' DDL in creation order, stamps, rows."""
    with connect(path) as db:
        return {
            "objects": db.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid"
            ).fetchall(),
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


def pg_dump(url: str) -> str:
    """The database's schema as ``pg_dump --schema-only`` writes it."""
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
    """The rows the history seeds, and the version stamps (times aside)."""
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
