"""The PostgreSQL store's schema versions: the one row of ``perseus_schema`` holds the database's
version, and :func:`migrate` applies the missing :data:`MIGRATIONS` in order, all in one
transaction under an advisory lock (two servers starting on one database migrate it once).

``iterations.n`` numbers each rank's rows (1, 2, ...): a rank keeps its newest rows by deleting
a range of its numbers, without counting what it holds.

``perseus_lease`` and ``perseus_epoch`` are the leadership of the servers sharing the database
(:mod:`perseus_server.runtime.leadership`); version 2 stores the leader's advertised addresses
with its lease.

Its versions are its own (not SQLite's ``user_version``): version 1 is the whole schema of the
first PostgreSQL release, equal in content to SQLite's version 8 (tenants included). A change of what is stored
appends a migration here (and one to :mod:`perseus_server.runtime.migrations`); one that shipped
is never edited. Text keys use the ``"C"`` collation so that ties order as SQLite's do
(by code point), whatever the database's locale.
"""

from __future__ import annotations

from typing import Any

from perseus_server.domain.store import StoreError

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_VERSION", "migrate", "schema_version"]

#: The advisory lock key the migrations run under ("perseus" in ASCII, as a bigint).
MIGRATION_LOCK = 0x70657273657573

_V1 = """
CREATE TABLE jobs (
    id TEXT COLLATE "C" PRIMARY KEY, created DOUBLE PRECISION NOT NULL, spec TEXT NOT NULL,
    tenant TEXT COLLATE "C" NOT NULL DEFAULT 'default'
);
CREATE INDEX jobs_tenant ON jobs (tenant);
CREATE TABLE tenants (
    id TEXT COLLATE "C" PRIMARY KEY, created DOUBLE PRECISION NOT NULL, max_jobs INTEGER,
    max_gpus INTEGER, weight DOUBLE PRECISION NOT NULL DEFAULT 1,
    guaranteed_watts DOUBLE PRECISION NOT NULL DEFAULT 0
);
INSERT INTO tenants (id, created) VALUES ('default', extract(epoch FROM now()));
CREATE TABLE profiles (
    job_id TEXT COLLATE "C" PRIMARY KEY, csv TEXT NOT NULL, revision INTEGER NOT NULL,
    updated DOUBLE PRECISION NOT NULL, source TEXT NOT NULL
);
CREATE TABLE frontiers (
    job_id TEXT COLLATE "C" PRIMARY KEY, status TEXT NOT NULL, progress DOUBLE PRECISION NOT NULL,
    error TEXT, doc TEXT, profile_revision INTEGER, started DOUBLE PRECISION,
    finished DOUBLE PRECISION, solve_seconds DOUBLE PRECISION, partial BOOLEAN NOT NULL
);
CREATE TABLE deployments (
    job_id TEXT COLLATE "C" PRIMARY KEY, version BIGINT NOT NULL, doc TEXT NOT NULL,
    updated DOUBLE PRECISION NOT NULL
);
CREATE TABLE ranks (
    job_id TEXT COLLATE "C" NOT NULL, global_rank INTEGER NOT NULL,
    rank_id TEXT COLLATE "C" NOT NULL UNIQUE, info TEXT NOT NULL,
    registered DOUBLE PRECISION NOT NULL, PRIMARY KEY (job_id, global_rank)
);
CREATE TABLE iterations (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, rank_id TEXT COLLATE "C" NOT NULL,
    n BIGINT NOT NULL DEFAULT 0, job_id TEXT COLLATE "C" NOT NULL, iteration BIGINT NOT NULL,
    time DOUBLE PRECISION NOT NULL, energy DOUBLE PRECISION NOT NULL,
    plan_version BIGINT NOT NULL, received DOUBLE PRECISION NOT NULL
);
CREATE INDEX iterations_rank ON iterations (rank_id, n);
CREATE INDEX iterations_job ON iterations (job_id);
CREATE TABLE profiling (job_id TEXT COLLATE "C" PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE report_sequences (
    seq BIGINT GENERATED ALWAYS AS IDENTITY, rank_id TEXT COLLATE "C" NOT NULL,
    incarnation BIGINT NOT NULL, job_id TEXT COLLATE "C" NOT NULL, last BIGINT NOT NULL,
    updated DOUBLE PRECISION NOT NULL, PRIMARY KEY (rank_id, incarnation)
);
CREATE INDEX report_sequences_job ON report_sequences (job_id);
CREATE TABLE power_budget (
    id INTEGER PRIMARY KEY CHECK (id = 1), doc TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL
);
CREATE TABLE credentials (
    id TEXT COLLATE "C" PRIMARY KEY, scope TEXT NOT NULL, job_id TEXT COLLATE "C",
    hash TEXT NOT NULL UNIQUE, created DOUBLE PRECISION NOT NULL, rotated DOUBLE PRECISION,
    revoked DOUBLE PRECISION, tenant TEXT COLLATE "C"
);
CREATE INDEX credentials_tenant ON credentials (tenant);
CREATE INDEX credentials_job ON credentials (job_id);
CREATE TABLE rank_bindings (
    rank_id TEXT COLLATE "C" PRIMARY KEY, job_id TEXT COLLATE "C" NOT NULL,
    global_rank INTEGER NOT NULL, credential_id TEXT NOT NULL, UNIQUE (job_id, global_rank)
);
CREATE TABLE job_lifecycle (
    job_id TEXT COLLATE "C" PRIMARY KEY, state TEXT NOT NULL, since DOUBLE PRECISION NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE perseus_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL
);
INSERT INTO perseus_lease (id, holder, expires) VALUES (1, '', '-infinity');
CREATE TABLE perseus_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, holder TEXT NOT NULL,
    since TIMESTAMPTZ NOT NULL
);
INSERT INTO perseus_epoch (id, epoch, holder, since) VALUES (1, 0, '', now())
"""

# The leader's advertised addresses (JSON: its gRPC address and REST URL), which a standby names
# in its answers (perseus_server.standby).
_V2 = """
ALTER TABLE perseus_lease ADD COLUMN advertise TEXT NOT NULL DEFAULT ''
"""

#: The ordered migrations: ``MIGRATIONS[k]`` (statements separated by ``;``) takes a database at
#: version ``k`` to ``k + 1``.
MIGRATIONS: tuple[str, ...] = (_V1, _V2)

#: The schema version this code reads and writes.
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: Any) -> int:
    """The database's schema version (0: no Perseus schema yet)."""
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() "
        "AND tablename = 'perseus_schema'"
    ).fetchone()
    if row is None:
        return 0
    got = conn.execute("SELECT version FROM perseus_schema").fetchone()
    return 0 if got is None else int(got[0])


def migrate(conn: Any, migrations: tuple[str, ...] = MIGRATIONS) -> int:
    """Bring the database of ``conn`` (a psycopg connection in autocommit mode) to version
    ``len(migrations)`` in one transaction; returns the version it had. Raises
    :class:`StoreError` when the database is newer than ``migrations`` knows."""
    target = len(migrations)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        found = schema_version(conn)
        if found > target:
            raise StoreError(
                f"the database has schema version {found}, newer than this server's {target}; "
                "use a newer server or another database"
            )
        if found == 0:
            conn.execute("CREATE TABLE perseus_schema (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO perseus_schema (version) VALUES (0)")
        for version in range(found, target):
            for statement in migrations[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
        if target != found:
            conn.execute("UPDATE perseus_schema SET version = %s", (target,))
    return found
