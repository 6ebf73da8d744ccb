"""``runtime/schema/legacy_postgres.py``: PostgreSQL databases of before Alembic, upgraded.

A database stamped by the PostgreSQL store's own version table (``perseus_schema``) is brought
through the missing steps, every row kept: a ``pg_dump`` of what the stores of ``e4f82c6`` wrote
(a fixture), and a database of version 1.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from perseus_server.runtime import schema
from perseus_server.runtime.schema import legacy_postgres
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.runtime.stores import engine_for
from perseus_server.testing.postgres import PostgresServer

from ...postgres_backend import database_for, postgres
from ...store_fixture import COUNTS, assert_holds, load_postgres
from .databases import counts, revision_of

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def test_a_postgres_database_of_the_stores_of_before_upgrades_keeping_every_row(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    load_postgres(url)
    assert revision_of(url) is None and counts(url) == COUNTS
    store = SqlStore.open(url)
    try:
        assert revision_of(url) == schema.head() and counts(url) == COUNTS
        assert_holds(store)
    finally:
        store.close()

    with psycopg.connect(url) as conn:  # a server of before refuses it as newer than itself
        assert conn.execute("SELECT version FROM perseus_schema").fetchone() == (1000,)


def test_a_postgres_database_of_version_1_gets_version_2_s_column(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    v1 = legacy_postgres.STEPS_SQL.split("ALTER TABLE perseus_lease")[0].rstrip().rstrip(";")
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in v1.split(";"):
            conn.execute(statement)
        conn.execute("CREATE TABLE perseus_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO perseus_schema VALUES (1)")
        conn.execute("INSERT INTO jobs (id, created, spec) VALUES ('kept', 1.0, '{}')")
    engine = engine_for(url, pool_size=1)
    try:
        with engine.connect() as conn:
            assert legacy_postgres.version(conn) == 1
    finally:
        engine.dispose()
    SqlStore.open(url).close()
    assert revision_of(url) == schema.head()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT holder, advertise FROM perseus_lease").fetchall() == [("", "")]
        assert conn.execute("SELECT id FROM jobs").fetchall() == [("kept",)]
        assert conn.execute("SELECT version FROM perseus_schema").fetchall() == [
            (legacy_postgres.MOVED,)
        ]
