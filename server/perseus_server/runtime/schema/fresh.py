"""A new database's schema, written directly: the head of the history without loading Alembic.

Every ``perseus serve`` on a new database (and every test that starts one) used to import
Alembic and SQLAlchemy and run the first revision: about 0.8 s of a process's start, against
a few milliseconds for these statements. :func:`create` writes the schema the history ends in
(the tables, their indexes and the rows the history seeds) and stamps ``alembic_version`` with
:data:`REVISION`, under the same lock a migration takes, when the database holds no table at
all; any other database (of an earlier revision, or stamped by the stores' earlier version
tables) is left to the history (:func:`~perseus_server.runtime.schema.migrate`).

The statements are generated, never written by hand: ``python scripts/gen_fresh_schema.py``
runs the history on an empty SQLite file and an empty PostgreSQL database and writes what it left
into :mod:`~perseus_server.runtime.schema.fresh_sql` (every object's DDL, in an order that
creates it, and the seeded rows). This module is only the logic: the emptiness check, the lock,
the statements, the stamp. A new revision without a regeneration fails the tests
(``tests/server/runtime/schema/test_fresh_sql.py``); until it is regenerated, :func:`create`
sees that :data:`REVISION` is not the head and declines (the history then runs, as before).
"""

from __future__ import annotations

from typing import Any

from perseus_server.runtime.schema import MIGRATION_LOCK, fresh_sql

__all__ = ["REVISION", "create", "statements"]

#: The revision the generated statements are the schema of.
REVISION = fresh_sql.REVISION

_SQLITE_EMPTY = "SELECT (SELECT count(*) FROM sqlite_master) + (SELECT * FROM pragma_user_version)"
_POSTGRES_EMPTY = (
    "SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
    "ON n.oid = c.relnamespace WHERE n.nspname = current_schema()"
)


def create(conn: Any, postgres: bool, head: str) -> bool:
    """Write the schema at ``head`` on the database of ``conn`` if it holds nothing yet.

    ``conn``: the driver's connection (``sqlite3`` or psycopg), in autocommit mode; ``head``:
    the history's newest revision. All of it or nothing, under the migration lock (SQLite's
    write lock, PostgreSQL's advisory lock), so servers starting at once on a new database
    create it once. Returns False, having written nothing, when the database holds any table
    (or anything at all, on SQLite) or ``head`` is not :data:`REVISION`.
    """
    if head != REVISION:
        return False
    if postgres:
        return _create_postgres(conn)
    return _create_sqlite(conn)


def statements(postgres: bool) -> tuple[str, ...]:
    """Every statement :func:`create` runs on a new database of the dialect, the stamp last."""
    stamp = f"INSERT INTO alembic_version (version_num) VALUES ('{REVISION}')"
    return (*(fresh_sql.POSTGRES if postgres else fresh_sql.SQLITE), stamp)


def _create_sqlite(conn: Any) -> bool:
    if conn.execute(_SQLITE_EMPTY).fetchone()[0]:
        return False
    conn.execute("BEGIN IMMEDIATE")
    try:
        empty = not conn.execute(_SQLITE_EMPTY).fetchone()[0]
        if empty:
            for statement in statements(False):
                conn.execute(statement)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return empty


def _create_postgres(conn: Any) -> bool:
    if conn.execute(_POSTGRES_EMPTY).fetchone()[0]:
        return False
    with conn.transaction():
        conn.execute(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        if conn.execute(_POSTGRES_EMPTY).fetchone()[0]:
            return False
        for statement in statements(True):
            conn.execute(statement)
    return True
