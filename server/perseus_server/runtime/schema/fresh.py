"""A new database's schema, written directly: the head of the history without loading Alembic.

Every ``perseus serve`` on a new database (and every test that starts one) used to import
Alembic and SQLAlchemy and run the first revision: about 0.8 s of a process's start, against
a few milliseconds for these statements. :func:`create` writes the schema the history ends in
(the tables, their indexes and the rows the history seeds) and stamps ``alembic_version`` with
:data:`REVISION`, under the same lock a migration takes, when the database holds no table at
all; any other database (of an earlier revision, or stamped by the stores' earlier version
tables) is left to the history (:func:`~perseus_server.runtime.schema.migrate`).

The statements are what ``alembic upgrade head`` leaves on an empty database: the tests compare
the two schemas on SQLite and PostgreSQL (``tests/server/runtime/test_schema_fresh.py``), so a
new revision that is not written here too fails them; until it is, :func:`create` sees that
:data:`REVISION` is not the head and declines (the history then runs, as before).
"""

from __future__ import annotations

from typing import Any

from perseus_server.runtime.schema import MIGRATION_LOCK
from perseus_server.runtime.schema import legacy_postgres as _legacy_postgres
from perseus_server.runtime.schema import legacy_sqlite as _legacy_sqlite

__all__ = ["POSTGRES", "REVISION", "SQLITE", "create"]

#: The revision these statements are the schema of.
REVISION = "0001"

#: The table Alembic keeps the revision in, as Alembic creates it (both dialects).
_VERSION_TABLE = f"""
CREATE TABLE alembic_version (
    version_num VARCHAR(32) NOT NULL,
    CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
INSERT INTO alembic_version (version_num) VALUES ('{REVISION}')
"""

#: SQLite at :data:`REVISION` (``user_version``: the stores of before refuse it as newer).
SQLITE = f"""
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, created REAL NOT NULL, spec TEXT NOT NULL,
    tenant TEXT NOT NULL DEFAULT 'default'
);
CREATE TABLE profiles (
    job_id TEXT PRIMARY KEY, csv TEXT NOT NULL, revision INTEGER NOT NULL, updated REAL NOT NULL,
    source TEXT NOT NULL
);
CREATE TABLE frontiers (
    job_id TEXT PRIMARY KEY, status TEXT NOT NULL, progress REAL NOT NULL, error TEXT,
    doc TEXT, profile_revision INTEGER, started REAL, finished REAL, solve_seconds REAL,
    ready_doc TEXT, partial INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE deployments (
    job_id TEXT PRIMARY KEY, version INTEGER NOT NULL, doc TEXT NOT NULL, updated REAL NOT NULL
);
CREATE TABLE ranks (
    job_id TEXT NOT NULL, global_rank INTEGER NOT NULL, rank_id TEXT NOT NULL UNIQUE,
    info TEXT NOT NULL, registered REAL NOT NULL, PRIMARY KEY (job_id, global_rank)
);
CREATE TABLE profiling (job_id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE power_budget (
    id INTEGER PRIMARY KEY CHECK (id = 1), doc TEXT NOT NULL, updated REAL NOT NULL
);
CREATE TABLE credentials (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, job_id TEXT, hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL, rotated REAL, revoked REAL, tenant TEXT
);
CREATE INDEX credentials_job ON credentials (job_id);
CREATE INDEX credentials_tenant ON credentials (tenant);
CREATE TABLE rank_bindings (
    rank_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, global_rank INTEGER NOT NULL,
    credential_id TEXT NOT NULL, UNIQUE (job_id, global_rank)
);
CREATE TABLE job_lifecycle (
    job_id TEXT PRIMARY KEY, state TEXT NOT NULL, since REAL NOT NULL, reason TEXT NOT NULL
);
CREATE TABLE tenants (
    id TEXT PRIMARY KEY, created REAL NOT NULL, max_jobs INTEGER, max_gpus INTEGER,
    weight REAL NOT NULL DEFAULT 1, guaranteed_watts REAL NOT NULL DEFAULT 0
);
INSERT INTO tenants (id, created, max_jobs, max_gpus, weight, guaranteed_watts)
    VALUES ('default', strftime('%s', 'now'), NULL, NULL, 1, 0);
CREATE INDEX jobs_tenant ON jobs (tenant);
CREATE TABLE iterations (
    seq INTEGER NOT NULL PRIMARY KEY, rank_id TEXT NOT NULL, n BIGINT NOT NULL DEFAULT 0,
    job_id TEXT NOT NULL, iteration BIGINT NOT NULL, time REAL NOT NULL, energy REAL NOT NULL,
    plan_version BIGINT NOT NULL, received REAL NOT NULL
);
CREATE INDEX iterations_rank ON iterations (rank_id, n);
CREATE INDEX iterations_job ON iterations (job_id);
CREATE TABLE report_sequences (
    seq INTEGER NOT NULL PRIMARY KEY, rank_id TEXT NOT NULL, incarnation BIGINT NOT NULL,
    job_id TEXT NOT NULL, last BIGINT NOT NULL, updated REAL NOT NULL,
    UNIQUE (rank_id, incarnation)
);
CREATE INDEX report_sequences_job ON report_sequences (job_id);
CREATE TABLE perseus_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, expires TEXT NOT NULL,
    advertise TEXT NOT NULL DEFAULT ''
);
CREATE TABLE perseus_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, holder TEXT NOT NULL,
    since TEXT NOT NULL
);
PRAGMA user_version = {_legacy_sqlite.MOVED};
{_VERSION_TABLE}
"""

#: PostgreSQL at :data:`REVISION`: the earlier history's steps, as the baseline runs them on a new
#: database, then its marker (``perseus_schema``: the stores of before refuse it as newer).
POSTGRES = f"""
{_legacy_postgres.STEPS_SQL};
CREATE TABLE perseus_schema (version INTEGER NOT NULL);
INSERT INTO perseus_schema (version) VALUES ({_legacy_postgres.MOVED});
{_VERSION_TABLE}
"""

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


def _statements(sql: str) -> list[str]:
    return [s for s in sql.split(";") if s.strip()]


def _create_sqlite(conn: Any) -> bool:
    if conn.execute(_SQLITE_EMPTY).fetchone()[0]:
        return False
    conn.execute("BEGIN IMMEDIATE")
    try:
        empty = not conn.execute(_SQLITE_EMPTY).fetchone()[0]
        if empty:
            for statement in _statements(SQLITE):
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
        for statement in _statements(POSTGRES):
            conn.execute(statement)
    return True
