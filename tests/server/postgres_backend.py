"""Test-only access to a real PostgreSQL server.

One per test session (``initdb`` / ``pg_ctl`` in a temporary directory, see
:class:`~perseus_server.testing.postgres.PostgresServer`), one fresh database per test (``CREATE
DATABASE`` copies an empty template in a few milliseconds).

Without PostgreSQL installed the tests that need it skip, saying so (CI has it: ``scripts/setup``
installs Debian's ``postgresql``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_server.testing.postgres import PostgresServer, postgres_binaries

__all__ = ["database_for", "postgres", "set_revision"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (skips when PostgreSQL is not installed)."""
    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (initdb / pg_ctl; Debian package postgresql)")
    with PostgresServer() as server:
        yield server


def database_for(pg: PostgresServer, tmp_path: Path) -> str:
    """The URL of the test's own database (named after its ``tmp_path``), created on first use."""
    name = "t_" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:16]
    created: set[str] = pg.__dict__.setdefault("_created", set())
    if name not in created:
        pg.create_database(name)
        created.add(name)
    return pg.url(name)


def set_revision(target: str | Path, revision: str) -> None:
    """Mark the database (SQLite or PostgreSQL) as migrated to ``revision`` by some server."""
    from perseus_server.runtime.stores import engine_for

    engine = engine_for(target, pool_size=1)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{revision}'")
    finally:
        engine.dispose()
