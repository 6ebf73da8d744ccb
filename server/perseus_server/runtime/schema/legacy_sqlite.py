"""The SQLite store's schema history before Alembic (frozen: versions 1 to 8).

A SQLite database written before the store moved to Alembic carries its version in ``PRAGMA
user_version`` (a database of the first release, which set none but has a ``jobs`` table, is
version 1). Alembic's first revision (``versions/r0001_baseline.py``) brings such a database, or
an empty one, through the missing :data:`STEPS`, and :func:`finish` takes it to the one schema
both databases share from that revision on; afterwards ``user_version`` says
:data:`MOVED`, which a server of before refuses as newer than itself. These steps shipped and
are never edited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["MOVED", "STEPS", "finish", "version"]

#: ``user_version`` of a database that moved to Alembic (older servers refuse it as newer).
MOVED = 1000

#: Schema version 1: the tables of the first release. A database without ``user_version`` that
#: holds a ``jobs`` table was written by that release and is version 1.
_V1_DDL = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, created REAL NOT NULL, spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS profiles (
    job_id TEXT PRIMARY KEY, csv TEXT NOT NULL, revision INTEGER NOT NULL, updated REAL NOT NULL,
    source TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS frontiers (
    job_id TEXT PRIMARY KEY, status TEXT NOT NULL, progress REAL NOT NULL, error TEXT,
    doc TEXT, profile_revision INTEGER, started REAL, finished REAL, solve_seconds REAL,
    ready_doc TEXT
);
CREATE TABLE IF NOT EXISTS deployments (
    job_id TEXT PRIMARY KEY, version INTEGER NOT NULL, doc TEXT NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ranks (
    job_id TEXT NOT NULL, global_rank INTEGER NOT NULL, rank_id TEXT NOT NULL UNIQUE,
    info TEXT NOT NULL, registered REAL NOT NULL, PRIMARY KEY (job_id, global_rank)
);
CREATE TABLE IF NOT EXISTS iterations (
    rank_id TEXT NOT NULL, job_id TEXT NOT NULL, iteration INTEGER NOT NULL, time REAL NOT NULL,
    energy REAL NOT NULL, plan_version INTEGER NOT NULL, received REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS iterations_rank ON iterations (rank_id, received);
CREATE TABLE IF NOT EXISTS profiling (
    job_id TEXT PRIMARY KEY, doc TEXT NOT NULL
);
"""


def _v1_initial(db: Any) -> None:
    """Version 1: the first release's tables."""
    for statement in _V1_DDL.split(";"):
        if statement.strip():
            db.exec_driver_sql(statement)


def _v3_power_budget(db: Any) -> None:
    """Version 3: the cluster power budget (one row at most: ``PUT /power-budget``'s settings)."""
    db.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS power_budget ("
        "id INTEGER PRIMARY KEY CHECK (id = 1), doc TEXT NOT NULL, updated REAL NOT NULL)"
    )


def _v2_report_sequences(db: Any) -> None:
    """Version 2: the highest report sequence accepted per rank (idempotent reports)."""
    db.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS report_sequences ("
        "rank_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, last INTEGER NOT NULL)"
    )


def _v4_credentials(db: Any) -> None:
    """Version 4: scoped credentials and the rank identities bound to them.

    Credentials are stored as their SHA-256 digests, never the secrets; a rank identity is bound
    to the credential that registered it.
    """
    db.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS credentials ("
        "id TEXT PRIMARY KEY, scope TEXT NOT NULL, job_id TEXT, hash TEXT NOT NULL UNIQUE, "
        "created REAL NOT NULL, rotated REAL, revoked REAL)"
    )
    db.exec_driver_sql("CREATE INDEX IF NOT EXISTS credentials_job ON credentials (job_id)")
    db.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS rank_bindings ("
        "rank_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, global_rank INTEGER NOT NULL, "
        "credential_id TEXT NOT NULL, UNIQUE (job_id, global_rank))"
    )


def _v5_partial_frontiers(db: Any) -> None:
    """Version 5: whether a job's stored frontier is partial.

    A partial frontier is the first plan of a solve, stored and deployed while the rest is
    computed; a solve cut short leaves it so.
    """
    db.exec_driver_sql("ALTER TABLE frontiers ADD COLUMN partial INTEGER NOT NULL DEFAULT 0")


def _v6_job_lifecycle(db: Any) -> None:
    """Version 6: each job's lifecycle (``active`` / ``idle`` / ``finished``, since when, why).

    So a finished or idle job stays out of the power budget after a restart.
    """
    db.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS job_lifecycle ("
        "job_id TEXT PRIMARY KEY, state TEXT NOT NULL, since REAL NOT NULL, reason TEXT NOT NULL)"
    )


def _v7_report_incarnations(db: Any) -> None:
    """Version 7: report sequences per (rank, client incarnation).

    So a restarted rank's reports are never compared with its previous run's sequences
    (incarnation 0: clients that send none, and every sequence stored before).
    """
    db.exec_driver_sql(
        "CREATE TABLE report_sequences_v7 ("
        "rank_id TEXT NOT NULL, incarnation INTEGER NOT NULL, job_id TEXT NOT NULL, "
        "last INTEGER NOT NULL, updated REAL NOT NULL DEFAULT 0, "
        "PRIMARY KEY (rank_id, incarnation))"
    )
    db.exec_driver_sql(
        "INSERT INTO report_sequences_v7 (rank_id, incarnation, job_id, last, updated) "
        "SELECT rank_id, 0, job_id, last, 0 FROM report_sequences"
    )
    db.exec_driver_sql("DROP TABLE report_sequences")
    db.exec_driver_sql("ALTER TABLE report_sequences_v7 RENAME TO report_sequences")
    db.exec_driver_sql(
        "CREATE INDEX IF NOT EXISTS report_sequences_job ON report_sequences (job_id)"
    )


def _v8_tenants(db: Any) -> None:
    """Version 8: tenants (teams) with their quotas and budget shares.

    Every job and issued credential names its tenant. The jobs stored before belong to the
    ``default`` tenant, which is created here (a single-tenant deployment goes on unchanged).
    """
    db.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS tenants ("
        "id TEXT PRIMARY KEY, created REAL NOT NULL, max_jobs INTEGER, max_gpus INTEGER, "
        "weight REAL NOT NULL DEFAULT 1, guaranteed_watts REAL NOT NULL DEFAULT 0)"
    )
    db.exec_driver_sql(
        "INSERT OR IGNORE INTO tenants (id, created, max_jobs, max_gpus, weight, "
        "guaranteed_watts) VALUES ('default', strftime('%s', 'now'), NULL, NULL, 1, 0)"
    )
    db.exec_driver_sql("ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'")
    db.exec_driver_sql("CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs (tenant)")
    db.exec_driver_sql("ALTER TABLE credentials ADD COLUMN tenant TEXT")


#: The steps: ``STEPS[k]`` takes a database at version ``k`` to ``k + 1``.
STEPS: tuple[Callable[[Any], None], ...] = (
    _v1_initial,
    _v2_report_sequences,
    _v3_power_budget,
    _v4_credentials,
    _v5_partial_frontiers,
    _v6_job_lifecycle,
    _v7_report_incarnations,
    _v8_tenants,
)

#: The history rows the store numbers itself (insertion order, and each rank's rows) and the
#: indexes and leadership tables both databases share from Alembic's first revision on.
_TO_BASELINE = """
CREATE TABLE iterations_new (
    seq INTEGER NOT NULL PRIMARY KEY, rank_id TEXT NOT NULL, n BIGINT NOT NULL DEFAULT 0,
    job_id TEXT NOT NULL, iteration BIGINT NOT NULL, time REAL NOT NULL, energy REAL NOT NULL,
    plan_version BIGINT NOT NULL, received REAL NOT NULL
);
INSERT INTO iterations_new
    SELECT rowid, rank_id, row_number() OVER (PARTITION BY rank_id ORDER BY rowid), job_id,
    iteration, time, energy, plan_version, received FROM iterations;
DROP TABLE iterations;
ALTER TABLE iterations_new RENAME TO iterations;
CREATE INDEX iterations_rank ON iterations (rank_id, n);
CREATE INDEX iterations_job ON iterations (job_id);
CREATE TABLE report_sequences_new (
    seq INTEGER NOT NULL PRIMARY KEY, rank_id TEXT NOT NULL, incarnation BIGINT NOT NULL,
    job_id TEXT NOT NULL, last BIGINT NOT NULL, updated REAL NOT NULL,
    UNIQUE (rank_id, incarnation)
);
INSERT INTO report_sequences_new
    SELECT rowid, rank_id, incarnation, job_id, last, updated FROM report_sequences;
DROP TABLE report_sequences;
ALTER TABLE report_sequences_new RENAME TO report_sequences;
CREATE INDEX report_sequences_job ON report_sequences (job_id);
CREATE INDEX IF NOT EXISTS credentials_tenant ON credentials (tenant);
CREATE TABLE perseus_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL, expires TEXT NOT NULL,
    advertise TEXT NOT NULL DEFAULT ''
);
CREATE TABLE perseus_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, holder TEXT NOT NULL,
    since TEXT NOT NULL
)
"""


def version(db: Any) -> int:
    """The database's version before Alembic: ``user_version``, 1 (the first release) or 0."""
    found = int(db.exec_driver_sql("PRAGMA user_version").scalar())
    jobs = db.exec_driver_sql(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'"
    ).first()
    return 1 if found == 0 and jobs is not None else found


def finish(db: Any) -> None:
    """Move the database, its steps all applied, to the baseline; mark it moved to Alembic."""
    for statement in _TO_BASELINE.split(";"):
        db.exec_driver_sql(statement)
    db.exec_driver_sql(f"PRAGMA user_version = {MOVED}")
