"""The store's schema versions, and the migrations between them.

The database's ``PRAGMA user_version`` is its schema version, and :func:`migrate` applies the
missing :data:`MIGRATIONS` in order, each in its own transaction (a database of the first release,
which set no version, is version 1). A change of what is stored appends a migration here; one that
shipped is never edited.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from perseus_server.domain.store import StoreError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "StoreError", "migrate", "schema_version"]

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


def _v1_initial(db: sqlite3.Connection) -> None:
    """Version 1: the first release's tables."""
    for statement in _V1_DDL.split(";"):
        if statement.strip():
            db.execute(statement)


def _v3_power_budget(db: sqlite3.Connection) -> None:
    """Version 3: the cluster power budget (one row at most: ``PUT /power-budget``'s settings)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS power_budget ("
        "id INTEGER PRIMARY KEY CHECK (id = 1), doc TEXT NOT NULL, updated REAL NOT NULL)"
    )


def _v2_report_sequences(db: sqlite3.Connection) -> None:
    """Version 2: the highest report sequence accepted per rank (idempotent reports)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS report_sequences ("
        "rank_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, last INTEGER NOT NULL)"
    )


def _v4_credentials(db: sqlite3.Connection) -> None:
    """Version 4: scoped credentials and the rank identities bound to them.

    Credentials are stored as their SHA-256 digests, never the secrets; a rank identity is bound
    to the credential that registered it.
    """
    db.execute(
        "CREATE TABLE IF NOT EXISTS credentials ("
        "id TEXT PRIMARY KEY, scope TEXT NOT NULL, job_id TEXT, hash TEXT NOT NULL UNIQUE, "
        "created REAL NOT NULL, rotated REAL, revoked REAL)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS credentials_job ON credentials (job_id)")
    db.execute(
        "CREATE TABLE IF NOT EXISTS rank_bindings ("
        "rank_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, global_rank INTEGER NOT NULL, "
        "credential_id TEXT NOT NULL, UNIQUE (job_id, global_rank))"
    )


def _v5_partial_frontiers(db: sqlite3.Connection) -> None:
    """Version 5: whether a job's stored frontier is partial.

    A partial frontier is the first plan of a solve, stored and deployed while the rest is
    computed; a solve cut short leaves it so.
    """
    db.execute("ALTER TABLE frontiers ADD COLUMN partial INTEGER NOT NULL DEFAULT 0")


def _v6_job_lifecycle(db: sqlite3.Connection) -> None:
    """Version 6: each job's lifecycle (``active`` / ``idle`` / ``finished``, since when, why).

    So a finished or idle job stays out of the power budget after a restart.
    """
    db.execute(
        "CREATE TABLE IF NOT EXISTS job_lifecycle ("
        "job_id TEXT PRIMARY KEY, state TEXT NOT NULL, since REAL NOT NULL, reason TEXT NOT NULL)"
    )


def _v7_report_incarnations(db: sqlite3.Connection) -> None:
    """Version 7: report sequences per (rank, client incarnation).

    So a restarted rank's reports are never compared with its previous run's sequences
    (incarnation 0: clients that send none, and every sequence stored before).
    """
    db.execute(
        "CREATE TABLE report_sequences_v7 ("
        "rank_id TEXT NOT NULL, incarnation INTEGER NOT NULL, job_id TEXT NOT NULL, "
        "last INTEGER NOT NULL, updated REAL NOT NULL DEFAULT 0, "
        "PRIMARY KEY (rank_id, incarnation))"
    )
    db.execute(
        "INSERT INTO report_sequences_v7 (rank_id, incarnation, job_id, last, updated) "
        "SELECT rank_id, 0, job_id, last, 0 FROM report_sequences"
    )
    db.execute("DROP TABLE report_sequences")
    db.execute("ALTER TABLE report_sequences_v7 RENAME TO report_sequences")
    db.execute("CREATE INDEX IF NOT EXISTS report_sequences_job ON report_sequences (job_id)")


def _v8_tenants(db: sqlite3.Connection) -> None:
    """Version 8: tenants (teams) with their quotas and budget shares.

    Every job and issued credential names its tenant. The jobs stored before belong to the
    ``default`` tenant, which is created here (a single-tenant deployment goes on unchanged).
    """
    db.execute(
        "CREATE TABLE IF NOT EXISTS tenants ("
        "id TEXT PRIMARY KEY, created REAL NOT NULL, max_jobs INTEGER, max_gpus INTEGER, "
        "weight REAL NOT NULL DEFAULT 1, guaranteed_watts REAL NOT NULL DEFAULT 0)"
    )
    db.execute(
        "INSERT OR IGNORE INTO tenants (id, created, max_jobs, max_gpus, weight, "
        "guaranteed_watts) VALUES ('default', strftime('%s', 'now'), NULL, NULL, 1, 0)"
    )
    db.execute("ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'")
    db.execute("CREATE INDEX IF NOT EXISTS jobs_tenant ON jobs (tenant)")
    db.execute("ALTER TABLE credentials ADD COLUMN tenant TEXT")


#: The ordered schema migrations: ``MIGRATIONS[k]`` takes a database at version ``k`` to
#: ``k + 1``. A later change of what is stored appends a function here (never edits one that
#: shipped); :meth:`~perseus_server.runtime.sqlite_store.SqliteStore.open` applies the missing
#: ones, each in its own transaction.
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _v1_initial,
    _v2_report_sequences,
    _v3_power_budget,
    _v4_credentials,
    _v5_partial_frontiers,
    _v6_job_lifecycle,
    _v7_report_incarnations,
    _v8_tenants,
)

#: The schema version this code reads and writes.
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(db: sqlite3.Connection) -> int:
    """The database's schema version: ``PRAGMA user_version``, 1 or 0.

    1 for a database of the first release (which set no version but has the ``jobs`` table), or
    0 for an empty one.
    """
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if (
        version == 0
        and db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'"
        ).fetchone()
    ):
        return 1
    return version


def migrate(
    db: sqlite3.Connection,
    migrations: tuple[Callable[[sqlite3.Connection], None], ...] = MIGRATIONS,
) -> int:
    """Bring ``db`` to version ``len(migrations)``, one transaction per step.

    Each step runs under SQLite's write lock after reading the version again, so processes
    opening one new file at once apply each step once.

    Returns the version it had. Raises :class:`StoreError` when the database is newer than
    ``migrations`` knows.
    """
    found = schema_version(db)
    target = len(migrations)
    if found > target:
        raise StoreError(
            f"the database has schema version {found}, newer than this server's {target}; "
            "use a newer server or another database"
        )
    if int(db.execute("PRAGMA user_version").fetchone()[0]) != found:
        db.execute(f"PRAGMA user_version = {found}")  # a first-release database says so now
    for version in range(found, target):
        db.execute("BEGIN IMMEDIATE")
        try:
            # Another process opening the same file may have applied this step meanwhile
            # (between the read above and this write lock): applied once, never twice.
            if int(db.execute("PRAGMA user_version").fetchone()[0]) <= version:
                migrations[version](db)
                db.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    return found
