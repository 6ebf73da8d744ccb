"""The PostgreSQL store's schema history before Alembic (frozen: versions 1 and 2).

A PostgreSQL database written before the store moved to Alembic carries its version in the one
row of ``perseus_schema``. Alembic's first revision (``versions/r0001_baseline.py``) brings such
a database, or an empty one, through the missing :data:`STEPS`: version 2 is the one schema both
databases share from that revision on. Afterwards ``perseus_schema`` says :data:`MOVED`, which a
server of before refuses as newer than itself. These steps shipped and
are never edited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MOVED", "STEPS", "STEPS_SQL", "finish", "version"]

#: ``perseus_schema.version`` of a database that moved to Alembic (older servers refuse it).
MOVED = 1000

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


def _statements(sql: str) -> Callable[[Any], None]:
    def step(db: Any) -> None:
        for statement in sql.split(";"):
            if statement.strip():
                db.exec_driver_sql(statement)

    return step


#: The steps: ``STEPS[k]`` takes a database at version ``k`` to ``k + 1``.
STEPS: tuple[Callable[[Any], None], ...] = (_statements(_V1), _statements(_V2))

#: Every step's statements, in order: what :data:`STEPS` runs on a new database.
STEPS_SQL = ";\n".join(sql.strip().rstrip(";") for sql in (_V1, _V2))


def version(db: Any) -> int:
    """The database's version before Alembic (0: no Perseus schema yet)."""
    row = db.exec_driver_sql(
        "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() "
        "AND tablename = 'perseus_schema'"
    ).first()
    if row is None:
        return 0
    got = db.exec_driver_sql("SELECT version FROM perseus_schema").first()
    return 0 if got is None else int(got[0])


def finish(db: Any) -> None:
    """Mark the database as moved to Alembic (its steps all applied)."""
    db.exec_driver_sql("CREATE TABLE IF NOT EXISTS perseus_schema (version INTEGER NOT NULL)")
    db.exec_driver_sql("DELETE FROM perseus_schema")
    db.exec_driver_sql(f"INSERT INTO perseus_schema (version) VALUES ({MOVED})")
