"""The embedded SQLite store (WAL mode).

The first implementation of the :class:`~perseus_server.domain.store.Store` protocol (its contract:
transactions that nest, rollback, after-commit callbacks, ordering): jobs, profiles, frontiers,
deployed plans, ranks, iteration history, online-profiling sessions, credentials and the power
budget.

Every write is one transaction, so a process killed at any moment leaves the database at the
last committed state. ``synchronous=NORMAL`` with WAL survives a killed process (not a power cut
of the host, which would lose at most the last transactions, never corrupt the file).
The store is used from the server's event-loop thread only; each call takes microseconds to a
few milliseconds (a large frontier document).

Schema versions: :meth:`SqliteStore.open` brings the database to this code's version with the
migrations of :mod:`perseus_server.runtime.migrations` (its names are re-exported here).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import (
    DEFAULT_TENANT,
    CredentialRow,
    FrontierRow,
    IterationRow,
    JobRow,
    RankIteration,
    TenantRow,
)
from perseus_server.domain.states import SolveStatus
from perseus_server.domain.store import StoreError
from perseus_server.runtime.migrations import MIGRATIONS, SCHEMA_VERSION, migrate, schema_version
from perseus_server.runtime.store_errors import disk_full
from perseus_server.runtime.store_rows import JOB_TABLES, rank_from_json

log = logging.getLogger("perseus.server")

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SqliteStore",
    "StoreError",
    "migrate",
    "schema_version",
]


_CREDENTIAL_COLUMNS = "id, scope, job_id, hash, created, rotated, revoked, tenant"
_TENANT_COLUMNS = "id, created, max_jobs, max_gpus, weight, guaranteed_watts"


class SqliteStore:
    """SQLite persistence of the server state (a :class:`~perseus_server.domain.store.Store`).

    Open with :meth:`open` (a file, or ``":memory:"``); close with :meth:`close`.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._db = conn
        self.path = path
        self._depth = 0
        self._after: list[Callable[[], object]] = []
        #: Told the kind of every write refused (``disk_full``); the service counts them.
        self.on_error: Callable[[str], None] = lambda kind: None

    @classmethod
    def open(cls, path: str | Path) -> SqliteStore:
        """Open (and migrate) the SQLite database at ``path``: a file, or ``":memory:"``."""
        p = Path(path)
        if str(p) != ":memory:":
            p.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(p), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        try:
            migrate(conn)
        except BaseException:
            conn.close()
            raise
        return cls(conn, p)

    def close(self) -> None:
        """Flush and release the database; the store is not used afterwards."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction around every write inside.

        Transactions nest: inner ones join the outer. Callbacks given to
        :meth:`after_commit` meanwhile run once it has committed.
        """
        with self._tx():
            yield

    def after_commit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once the current transaction commits (now, outside of one).

        Dropped on rollback.
        """
        if self._depth == 0:
            fn()
        else:
            self._after.append(fn)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self._depth > 0:
            self._depth += 1
            try:
                yield self._db
            finally:
                self._depth -= 1
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            self._refuse(e)
        self._depth = 1
        try:
            yield self._db
            self._depth = 0
            self._db.execute("COMMIT")
        except BaseException as e:
            self._depth = 0
            self._after.clear()
            if self._db.in_transaction:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    log.exception("store %s: rollback failed", self.path)
            self._refuse(e)
        after, self._after = self._after, []
        for fn in after:
            fn()

    def _refuse(self, e: BaseException) -> NoReturn:
        """Raise ``e``, or the retryable :class:`StoreUnavailable` for a full disk (counted)."""
        full = disk_full(e, str(self.path))
        if full is None:
            raise e
        self.on_error(full.kind)
        raise full from e

    # --- jobs ------------------------------------------------------------------------------------

    def add_job(self, job_id: str, spec: JobSpec, tenant: str = DEFAULT_TENANT) -> JobRow:
        """Store a new job of ``tenant`` (``job_id`` not stored yet); returns its row."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs (id, created, spec, tenant) VALUES (?, ?, ?, ?)",
                (job_id, now, json.dumps(spec.to_json()), tenant),
            )
        return JobRow(job_id, now, spec, tenant)

    def jobs(self, on_error: Callable[[str, Exception], None] | None = None) -> list[JobRow]:
        """Every job whose description can be read.

        ``on_error(id, exc)`` hears of the others (without it, an unreadable row raises).
        """
        rows = self._db.execute(
            "SELECT id, created, spec, tenant FROM jobs ORDER BY created, id"
        ).fetchall()
        out = []
        for r in rows:
            try:
                out.append(JobRow(r[0], r[1], JobSpec.from_json(json.loads(r[2])), str(r[3])))
            except Exception as e:
                if on_error is None:
                    raise
                on_error(str(r[0]), e)
        return out

    def count_jobs(self) -> int:
        """The number of stored jobs."""
        return int(self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])

    def delete_job(self, job_id: str) -> None:
        """Forget the job and everything stored of it."""
        with self._tx() as db:
            for table, col in JOB_TABLES:
                db.execute(f"DELETE FROM {table} WHERE {col} = ?", (job_id,))

    # --- profiles --------------------------------------------------------------------------------

    def put_profile(self, job_id: str, csv_text: str, source: str) -> int:
        """Store the profile (canonical CSV); returns its new revision number."""
        with self._tx() as db:
            row = db.execute("SELECT revision FROM profiles WHERE job_id = ?", (job_id,)).fetchone()
            rev = (row[0] if row else 0) + 1
            db.execute(
                "INSERT OR REPLACE INTO profiles (job_id, csv, revision, updated, source) VALUES (?, ?, ?, ?, ?)",
                (job_id, csv_text, rev, time.time(), source),
            )
        return rev

    def profile(self, job_id: str) -> tuple[str, int, str] | None:
        """``(csv, revision, source)`` or None."""
        row = self._db.execute(
            "SELECT csv, revision, source FROM profiles WHERE job_id = ?", (job_id,)
        ).fetchone()
        return None if row is None else (row[0], int(row[1]), row[2])

    # --- frontiers -------------------------------------------------------------------------------

    def frontier(self, job_id: str) -> FrontierRow:
        """The job's frontier state (a default row when none is stored)."""
        row = self._db.execute(
            "SELECT status, progress, error, doc, profile_revision, started, finished, solve_seconds, "
            "partial FROM frontiers WHERE job_id = ?",
            (job_id,),
        ).fetchone()
        return FrontierRow() if row is None else FrontierRow(*row)

    def put_frontier(self, job_id: str, row: FrontierRow) -> None:
        """Store the job's frontier state (replacing any)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO frontiers (job_id, status, progress, error, doc, profile_revision, "
                "started, finished, solve_seconds, partial) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    row.status,
                    row.progress,
                    row.error,
                    row.doc,
                    row.profile_revision,
                    row.started,
                    row.finished,
                    row.solve_seconds,
                    int(row.partial),
                ),
            )

    def interrupted_solves(self) -> list[str]:
        """The jobs whose stored frontier state is queued, running or partial."""
        rows = self._db.execute(
            "SELECT job_id FROM frontiers WHERE status IN (?, ?, ?)",
            (SolveStatus.QUEUED.value, SolveStatus.RUNNING.value, SolveStatus.PARTIAL.value),
        ).fetchall()
        return [r[0] for r in rows]

    # --- deployments -----------------------------------------------------------------------------

    def deployment(self, job_id: str) -> tuple[int, dict[str, Any]] | None:
        """``(plan version, deployment document)``, or None."""
        row = self._db.execute(
            "SELECT version, doc FROM deployments WHERE job_id = ?", (job_id,)
        ).fetchone()
        return None if row is None else (int(row[0]), json.loads(row[1]))

    def put_deployment(self, job_id: str, version: int, doc: dict[str, Any]) -> None:
        """Store the job's deployment document as ``version``."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO deployments (job_id, version, doc, updated) VALUES (?, ?, ?, ?)",
                (job_id, version, json.dumps(doc), time.time()),
            )

    # --- ranks -----------------------------------------------------------------------------------

    def ranks(self, job_id: str) -> list[RankInfo]:
        """The job's registered ranks by global rank."""
        rows = self._db.execute(
            "SELECT info FROM ranks WHERE job_id = ? ORDER BY global_rank", (job_id,)
        ).fetchall()
        return [rank_from_json(job_id, json.loads(r[0])) for r in rows]

    def put_rank(self, rank: RankInfo) -> None:
        """Store (or replace) the rank in its job's slot ``global_rank``."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO ranks (job_id, global_rank, rank_id, info, registered) VALUES (?, ?, ?, ?, ?)",
                (
                    rank.job_id,
                    rank.global_rank,
                    rank.rank_id,
                    json.dumps(rank.to_json()),
                    time.time(),
                ),
            )

    # --- iterations ------------------------------------------------------------------------------

    def add_iterations(
        self,
        job_id: str,
        rows: list[IterationRow],
        keep: int,
        sequences: dict[tuple[str, int], int] | None = None,
        incarnations_kept: int = 8,
    ) -> None:
        """Append ``(rank_id, iteration, time, energy, plan_version)`` rows; record the sequences.

        Keep the newest ``keep`` per rank; record the highest accepted report ``sequences``
        of each ``(rank_id, incarnation)`` in the same transaction, keeping the
        ``incarnations_kept`` most recently updated incarnations of each rank.
        """
        if not rows:
            return
        now = time.time()
        with self._tx() as db:
            if sequences:
                db.executemany(
                    "INSERT INTO report_sequences (rank_id, incarnation, job_id, last, updated) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(rank_id, incarnation) DO UPDATE SET "
                    "last = MAX(last, excluded.last), updated = excluded.updated",
                    [(r, int(inc), job_id, int(s), now) for (r, inc), s in sequences.items()],
                )
                for rank_id in {r for r, _ in sequences}:
                    db.execute(
                        "DELETE FROM report_sequences WHERE rank_id = ? AND incarnation NOT IN "
                        "(SELECT incarnation FROM report_sequences WHERE rank_id = ? "
                        "ORDER BY updated DESC, rowid DESC LIMIT ?)",
                        (rank_id, rank_id, incarnations_kept),
                    )
            db.executemany(
                "INSERT INTO iterations (rank_id, job_id, iteration, time, energy, plan_version, received) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(r, job_id, it, t, e, v, now) for r, it, t, e, v in rows],
            )
            for rank_id in {r[0] for r in rows}:
                db.execute(
                    "DELETE FROM iterations WHERE rank_id = ? AND rowid NOT IN "
                    "(SELECT rowid FROM iterations WHERE rank_id = ? ORDER BY rowid DESC LIMIT ?)",
                    (rank_id, rank_id, keep),
                )

    def report_sequences(self, job_id: str) -> dict[str, dict[int, int]]:
        """The highest accepted report sequence of each (rank, incarnation) of the job.

        As ``{rank_id: {incarnation: last}}``, each rank's incarnations least recently
        updated first.
        """
        rows = self._db.execute(
            "SELECT rank_id, incarnation, last FROM report_sequences WHERE job_id = ? "
            "ORDER BY updated, rowid",
            (job_id,),
        ).fetchall()
        out: dict[str, dict[int, int]] = {}
        for rank_id, incarnation, last in rows:
            out.setdefault(str(rank_id), {})[int(incarnation)] = int(last)
        return out

    def iterations(self, rank_id: str, limit: int) -> list[RankIteration]:
        """The newest ``limit`` ``(iteration, time, energy, plan_version)`` of a rank, oldest first."""
        rows = self._db.execute(
            "SELECT iteration, time, energy, plan_version FROM iterations WHERE rank_id = ? "
            "ORDER BY rowid DESC LIMIT ?",
            (rank_id, limit),
        ).fetchall()
        return [(int(a), float(b), float(c), int(d)) for a, b, c, d in reversed(rows)]

    # --- profiling sessions ----------------------------------------------------------------------

    def profiling(self, job_id: str) -> dict[str, Any] | None:
        """The job's online-profiling session document, or None."""
        row = self._db.execute("SELECT doc FROM profiling WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_profiling(self, job_id: str, doc: dict[str, Any]) -> None:
        """Store the job's online-profiling session document."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO profiling (job_id, doc) VALUES (?, ?)",
                (job_id, json.dumps(doc)),
            )

    # --- credentials ------------------------------------------------------------------------------

    def add_credential(
        self,
        credential_id: str,
        scope: str,
        job_id: str | None,
        digest: str,
        tenant: str | None = None,
    ) -> CredentialRow:
        """Store a new credential (``tenant``: a tenant credential's tenant)."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                f"INSERT INTO credentials ({_CREDENTIAL_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, NULL, NULL, ?)",
                (credential_id, scope, job_id, digest, now, tenant),
            )
        return CredentialRow(credential_id, scope, job_id, digest, now, None, None, tenant)

    def credential_by_hash(self, digest: str) -> CredentialRow | None:
        """The credential whose secret has this digest, revoked or not."""
        row = self._db.execute(
            f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials WHERE hash = ?", (digest,)
        ).fetchone()
        return None if row is None else CredentialRow(*row)

    def credential(self, credential_id: str) -> CredentialRow | None:
        """The credential ``credential_id``, or None."""
        row = self._db.execute(
            f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials WHERE id = ?", (credential_id,)
        ).fetchone()
        return None if row is None else CredentialRow(*row)

    def credentials(self, job_id: str | None = None) -> list[CredentialRow]:
        """Every stored credential (of one job when ``job_id`` is given), oldest first."""
        where, args = ("WHERE job_id = ?", (job_id,)) if job_id is not None else ("", ())
        rows = self._db.execute(
            f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials {where} ORDER BY created, id", args
        ).fetchall()
        return [CredentialRow(*r) for r in rows]

    def rotate_credential(self, credential_id: str, digest: str) -> None:
        """A new secret digest for the credential (the old secret stops working); un-revokes."""
        with self._tx() as db:
            db.execute(
                "UPDATE credentials SET hash = ?, rotated = ?, revoked = NULL WHERE id = ?",
                (digest, time.time(), credential_id),
            )

    def revoke_credential(self, credential_id: str) -> bool:
        """Mark the credential revoked; False when it is unknown or was revoked already."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE credentials SET revoked = ? WHERE id = ? AND revoked IS NULL",
                (time.time(), credential_id),
            )
        return cur.rowcount > 0

    def bind_rank(self, rank_id: str, job_id: str, global_rank: int, credential_id: str) -> str:
        """Bind a rank identity to a credential unless it is bound already.

        Returns the credential it is bound to (``credential_id`` or the earlier one).
        """
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO rank_bindings (rank_id, job_id, global_rank, credential_id) "
                "VALUES (?, ?, ?, ?)",
                (rank_id, job_id, global_rank, credential_id),
            )
            row = db.execute(
                "SELECT credential_id FROM rank_bindings WHERE rank_id = ? "
                "OR (job_id = ? AND global_rank = ?)",
                (rank_id, job_id, global_rank),
            ).fetchone()
        return str(row[0])

    def slot_binding(self, job_id: str, global_rank: int) -> str | None:
        """The credential the job's rank ``global_rank`` is bound to (None: unbound)."""
        row = self._db.execute(
            "SELECT credential_id FROM rank_bindings WHERE job_id = ? AND global_rank = ?",
            (job_id, global_rank),
        ).fetchone()
        return None if row is None else str(row[0])

    def rank_binding(self, rank_id: str) -> tuple[str, str] | None:
        """``(job_id, credential_id)`` the rank identity is bound to (None: unbound)."""
        row = self._db.execute(
            "SELECT job_id, credential_id FROM rank_bindings WHERE rank_id = ?", (rank_id,)
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    # --- tenants ---------------------------------------------------------------------------------

    def tenants(self) -> list[TenantRow]:
        """Every tenant, oldest first (ties by id)."""
        rows = self._db.execute(
            f"SELECT {_TENANT_COLUMNS} FROM tenants ORDER BY created, id"
        ).fetchall()
        return [TenantRow(*r) for r in rows]

    def put_tenant(self, row: TenantRow) -> None:
        """Store a new tenant, or replace a stored one's quotas (its ``created`` is kept)."""
        with self._tx() as db:
            db.execute(
                f"INSERT INTO tenants ({_TENANT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET max_jobs = excluded.max_jobs, "
                "max_gpus = excluded.max_gpus, weight = excluded.weight, "
                "guaranteed_watts = excluded.guaranteed_watts",
                (row.id, row.created, row.max_jobs, row.max_gpus, row.weight,
                 row.guaranteed_watts),
            )  # fmt: skip

    def delete_tenant(self, tenant_id: str) -> bool:
        """Forget a tenant and its credentials; False when it is unknown.

        Its jobs are the caller's business.
        """
        with self._tx() as db:
            cur = db.execute("DELETE FROM tenants WHERE id = ?", (tenant_id,))
            db.execute("DELETE FROM credentials WHERE tenant = ?", (tenant_id,))
        return cur.rowcount > 0

    # --- the cluster power budget ----------------------------------------------------------------

    def power_budget(self) -> dict[str, Any] | None:
        """The cluster power budget's settings, or None when none is set."""
        row = self._db.execute("SELECT doc FROM power_budget WHERE id = 1").fetchone()
        return None if row is None else json.loads(row[0])

    def put_power_budget(self, doc: dict[str, Any] | None) -> None:
        """Store the budget's settings (``None``: remove it)."""
        with self._tx() as db:
            if doc is None:
                db.execute("DELETE FROM power_budget")
            else:
                db.execute(
                    "INSERT OR REPLACE INTO power_budget (id, doc, updated) VALUES (1, ?, ?)",
                    (json.dumps(doc), time.time()),
                )

    # --- job lifecycles --------------------------------------------------------------------------

    def job_lifecycles(self) -> dict[str, tuple[str, float, str]]:
        """Per job, its stored lifecycle ``(state, since, reason)``."""
        rows = self._db.execute("SELECT job_id, state, since, reason FROM job_lifecycle")
        return {str(r[0]): (str(r[1]), float(r[2]), str(r[3])) for r in rows.fetchall()}

    def put_job_lifecycle(self, job_id: str, state: str, since: float, reason: str) -> None:
        """Store (or replace) a job's lifecycle; deleting the job removes it."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO job_lifecycle (job_id, state, since, reason) "
                "VALUES (?, ?, ?, ?)",
                (job_id, state, since, reason),
            )
