"""The store: the server state in SQLite (the embedded default) or PostgreSQL, written once.

It implements :class:`~perseus_server.domain.store.Store` with one SQL text per statement for
both databases (``--db``: a file path or ``sqlite:///PATH``, or ``postgresql://user@host/db`` for
deployments that already run PostgreSQL or want two servers, active and standby). The
connection, the transactions, the fencing, the refusals and the few words the two dialects
spell differently are :class:`~perseus_server.runtime.sql_connection.SqlConnection`'s, this
store's base; the schema is brought to this code's revision when a store opens (Alembic:
:mod:`perseus_server.runtime.schema`). Adding a column is one revision there and its use here.

- **Durability.** Every write is one transaction, so a process killed at any moment leaves the
  database at the last committed state. SQLite: WAL with ``synchronous=NORMAL`` survives a killed
  process (a power cut of the host loses at most the last transactions, never the file).
  PostgreSQL: a commit is durable when the database says so (``synchronous_commit``).
- **Threads.** SQLite's store is used from the server's event-loop thread only. PostgreSQL's
  may be used from several threads at once (``thread_safe``): each thread's transaction runs on
  its own connection of a pool, and a read outside of one borrows any free one. The server uses
  this to commit iteration reports off the event loop
  (:class:`~perseus_server.service.ingest.ReportWriter`).
- **Concurrency.** Every write is one statement or reads what it changes under a lock (SQLite's
  write lock, taken by ``BEGIN IMMEDIATE``; PostgreSQL's row locks), so two writers never lose
  an update. Iterations written for a job that was deleted meanwhile are dropped.
- **The database lost** (PostgreSQL), or **a full disk**: the write is refused with the
  retryable :class:`~perseus_server.domain.errors.StoreUnavailable`, counted, nothing of it kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import (
    DEFAULT_TENANT,
    CredentialRow,
    FrontierRow,
    JobRow,
    TenantRow,
)
from perseus_server.domain.states import SolveStatus
from perseus_server.runtime.sql_history import HistoryTables
from perseus_server.runtime.store_rows import rank_from_json

__all__ = ["SqlStore"]

_CREDENTIAL = "id, scope, job_id, hash, created, rotated, revoked, tenant"
_TENANT = "id, created, max_jobs, max_gpus, weight, guaranteed_watts"
_FRONTIER = (
    "status, progress, error, doc, profile_revision, started, finished, solve_seconds, partial"
)
#: ``(table, column naming the job)`` of everything :meth:`SqlStore.delete_job` forgets.
_JOB_TABLES = (
    ("jobs", "id"), ("profiles", "job_id"), ("frontiers", "job_id"), ("deployments", "job_id"),
    ("ranks", "job_id"), ("iterations", "job_id"), ("profiling", "job_id"),
    ("report_sequences", "job_id"), ("credentials", "job_id"), ("rank_bindings", "job_id"),
    ("job_lifecycle", "job_id"),
)  # fmt: skip


def _upsert(table: str, columns: str, keys: str, keep: tuple[str, ...] = ()) -> str:
    """Insert a row, or replace its other columns (not ``keep``) where ``keys`` match."""
    names = [c.strip() for c in columns.split(",")]
    rest = [c for c in names if c not in keys.split(", ") and c not in keep]
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' for _ in names)}) "
        f"ON CONFLICT ({keys}) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in rest)
    )


_PUT_FRONTIER = _upsert("frontiers", f"job_id, {_FRONTIER}", "job_id")
_PUT_DEPLOYMENT = _upsert("deployments", "job_id, version, doc, updated", "job_id")
_PUT_PROFILING = _upsert("profiling", "job_id, doc", "job_id")
_PUT_TENANT = _upsert("tenants", _TENANT, "id", keep=("created",))
_PUT_BUDGET = _upsert("power_budget", "id, doc, updated", "id")
_PUT_LIFECYCLE = _upsert("job_lifecycle", "job_id, state, since, reason", "job_id")
_INTERRUPTED = (SolveStatus.QUEUED.value, SolveStatus.RUNNING.value, SolveStatus.PARTIAL.value)


class SqlStore(HistoryTables):
    """The server state's persistence (a :class:`~perseus_server.domain.store.Store`).

    Open with :meth:`open` (what ``--db`` names); close with :meth:`close`.
    """

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        """One statement in a transaction of its own (or the open one); rows it changed."""
        with self._tx() as db:
            return int(db.run(sql, args).rowcount)

    def _doc(self, sql: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
        row = self._row(sql, args)
        return None if row is None else json.loads(row[0])

    # --- jobs ------------------------------------------------------------------------------------

    def add_job(self, job_id: str, spec: JobSpec, tenant: str = DEFAULT_TENANT) -> JobRow:
        """Store a new job of ``tenant`` (``job_id`` not stored yet); returns its row."""
        now = time.time()
        self._write(
            "INSERT INTO jobs (id, created, spec, tenant) VALUES (?, ?, ?, ?)",
            (job_id, now, json.dumps(spec.to_json()), tenant),
        )
        return JobRow(job_id, now, spec, tenant)

    def jobs(self, on_error: Callable[[str, Exception], None] | None = None) -> list[JobRow]:
        """Every job whose description can be read, oldest first.

        ``on_error(id, exc)`` hears of the others (without it, an unreadable row raises).
        """
        out = []
        for r in self._rows("SELECT id, created, spec, tenant FROM jobs ORDER BY created, id"):
            try:
                out.append(JobRow(r[0], r[1], JobSpec.from_json(json.loads(r[2])), str(r[3])))
            except Exception as e:
                if on_error is None:
                    raise
                on_error(str(r[0]), e)
        return out

    def delete_job(self, job_id: str) -> None:
        """Forget the job and everything stored of it."""
        with self._tx() as db:
            for table, column in _JOB_TABLES:
                db.run(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))

    # --- profiles, frontiers, deployments, profiling sessions ------------------------------------

    def put_profile(self, job_id: str, csv_text: str, source: str) -> int:
        """Store the job's profile (canonical CSV); returns its new revision (1, 2, ...)."""
        with self._tx() as db:
            row = db.run(
                "INSERT INTO profiles (job_id, csv, revision, updated, source) "
                "VALUES (?, ?, 1, ?, ?) ON CONFLICT (job_id) DO UPDATE SET csv = excluded.csv, "
                "revision = profiles.revision + 1, updated = excluded.updated, "
                "source = excluded.source RETURNING revision",
                (job_id, csv_text, time.time(), source),
            ).fetchone()
        return int(row[0])

    def profile(self, job_id: str) -> tuple[str, int, str] | None:
        """``(csv, revision, source)``, or None."""
        row = self._row("SELECT csv, revision, source FROM profiles WHERE job_id = ?", (job_id,))
        return None if row is None else (row[0], int(row[1]), row[2])

    def frontier(self, job_id: str) -> FrontierRow:
        """The job's frontier state (a default row when none is stored)."""
        row = self._row(f"SELECT {_FRONTIER} FROM frontiers WHERE job_id = ?", (job_id,))
        return FrontierRow() if row is None else FrontierRow(*row)

    def put_frontier(self, job_id: str, row: FrontierRow) -> None:
        """Store the job's frontier state (replacing any)."""
        self._write(
            _PUT_FRONTIER,
            (job_id, SolveStatus(row.status).value, row.progress, row.error, row.doc,
             row.profile_revision, row.started, row.finished, row.solve_seconds,
             bool(row.partial)),
        )  # fmt: skip

    def interrupted_solves(self) -> list[str]:
        """The jobs whose stored frontier state is queued, running or partial."""
        rows = self._rows(
            "SELECT job_id FROM frontiers WHERE status IN (?, ?, ?) ORDER BY job_id", _INTERRUPTED
        )
        return [r[0] for r in rows]

    def deployment(self, job_id: str) -> tuple[int, dict[str, Any]] | None:
        """``(plan version, deployment document)``, or None."""
        row = self._row("SELECT version, doc FROM deployments WHERE job_id = ?", (job_id,))
        return None if row is None else (int(row[0]), json.loads(row[1]))

    def put_deployment(self, job_id: str, version: int, doc: dict[str, Any]) -> None:
        """Store the job's deployment document as ``version``."""
        self._write(_PUT_DEPLOYMENT, (job_id, version, json.dumps(doc), time.time()))

    def profiling(self, job_id: str) -> dict[str, Any] | None:
        """The job's online-profiling session document, or None."""
        return self._doc("SELECT doc FROM profiling WHERE job_id = ?", (job_id,))

    def put_profiling(self, job_id: str, doc: dict[str, Any]) -> None:
        """Store the job's online-profiling session document."""
        self._write(_PUT_PROFILING, (job_id, json.dumps(doc)))

    # --- ranks -----------------------------------------------------------------------------------

    def ranks(self, job_id: str) -> list[RankInfo]:
        """The job's registered ranks by global rank."""
        rows = self._rows("SELECT info FROM ranks WHERE job_id = ? ORDER BY global_rank", (job_id,))
        return [rank_from_json(job_id, json.loads(r[0])) for r in rows]

    def put_rank(self, rank: RankInfo) -> None:
        """Store (or replace) the rank in its job's slot ``global_rank``.

        The row of the slot and any row of the rank's identity are replaced.
        """
        with self._tx() as db:
            db.run(
                "DELETE FROM ranks WHERE (job_id = ? AND global_rank = ?) OR rank_id = ?",
                (rank.job_id, rank.global_rank, rank.rank_id),
            )
            db.run(
                "INSERT INTO ranks (job_id, global_rank, rank_id, info, registered) "
                "VALUES (?, ?, ?, ?, ?)",
                (rank.job_id, rank.global_rank, rank.rank_id, json.dumps(rank.to_json()),
                 time.time()),
            )  # fmt: skip

    # --- credentials -----------------------------------------------------------------------------

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
        self._write(
            f"INSERT INTO credentials ({_CREDENTIAL}) VALUES (?, ?, ?, ?, ?, NULL, NULL, ?)",
            (credential_id, scope, job_id, digest, now, tenant),
        )
        return CredentialRow(credential_id, scope, job_id, digest, now, None, None, tenant)

    def credential_by_hash(self, digest: str) -> CredentialRow | None:
        """The credential whose secret has this digest, revoked or not."""
        row = self._row(f"SELECT {_CREDENTIAL} FROM credentials WHERE hash = ?", (digest,))
        return None if row is None else CredentialRow(*row)

    def credentials(self, job_id: str | None = None) -> list[CredentialRow]:
        """Every credential (of one job when ``job_id`` is given), oldest first."""
        where, args = ("WHERE job_id = ?", (job_id,)) if job_id is not None else ("", ())
        rows = self._rows(
            f"SELECT {_CREDENTIAL} FROM credentials {where} ORDER BY created, id", args
        )
        return [CredentialRow(*r) for r in rows]

    def rotate_credential(self, credential_id: str, digest: str) -> None:
        """A new secret digest (the old one stops working); un-revokes."""
        self._write(
            "UPDATE credentials SET hash = ?, rotated = ?, revoked = NULL WHERE id = ?",
            (digest, time.time(), credential_id),
        )

    def revoke_credential(self, credential_id: str) -> bool:
        """Mark it revoked; False when it is unknown or was revoked already."""
        return (
            self._write(
                "UPDATE credentials SET revoked = ? WHERE id = ? AND revoked IS NULL",
                (time.time(), credential_id),
            )
            > 0
        )

    def bind_rank(self, rank_id: str, job_id: str, global_rank: int, credential_id: str) -> str:
        """Bind a rank identity (and its job's slot) to a credential unless bound already.

        Returns the credential it is bound to (``credential_id`` or the earlier one).
        """
        with self._tx() as db:
            db.run(
                "INSERT INTO rank_bindings (rank_id, job_id, global_rank, credential_id) "
                "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (rank_id, job_id, global_rank, credential_id),
            )
            row = db.run(
                "SELECT credential_id FROM rank_bindings WHERE rank_id = ? "
                "OR (job_id = ? AND global_rank = ?) LIMIT 1",
                (rank_id, job_id, global_rank),
            ).fetchone()
        return str(row[0])

    def slot_binding(self, job_id: str, global_rank: int) -> str | None:
        """The credential the job's slot ``global_rank`` is bound to, or None."""
        row = self._row(
            "SELECT credential_id FROM rank_bindings WHERE job_id = ? AND global_rank = ?",
            (job_id, global_rank),
        )
        return None if row is None else str(row[0])

    def rank_binding(self, rank_id: str) -> tuple[str, str] | None:
        """``(job_id, credential_id)`` the rank identity is bound to, or None."""
        row = self._row(
            "SELECT job_id, credential_id FROM rank_bindings WHERE rank_id = ?", (rank_id,)
        )
        return None if row is None else (str(row[0]), str(row[1]))

    # --- tenants, the cluster power budget, job lifecycles ---------------------------------------

    def tenants(self) -> list[TenantRow]:
        """Every tenant, oldest first (ties by id). A new database holds the ``default`` one."""
        return [
            TenantRow(*r) for r in self._rows(f"SELECT {_TENANT} FROM tenants ORDER BY created, id")
        ]

    def put_tenant(self, row: TenantRow) -> None:
        """Store a new tenant, or replace a stored one's quotas (keeping its ``created``)."""
        self._write(
            _PUT_TENANT,
            (row.id, row.created, row.max_jobs, row.max_gpus, row.weight, row.guaranteed_watts),
        )

    def delete_tenant(self, tenant_id: str) -> bool:
        """Forget a tenant and the credentials of its tenant; False when it is unknown.

        Its jobs are the caller's business (the service refuses to delete a tenant with any).
        """
        with self._tx() as db:
            gone = int(db.run("DELETE FROM tenants WHERE id = ?", (tenant_id,)).rowcount)
            db.run("DELETE FROM credentials WHERE tenant = ?", (tenant_id,))
        return gone > 0

    def power_budget(self) -> dict[str, Any] | None:
        """The cluster power budget's settings, or None when none is set."""
        return self._doc("SELECT doc FROM power_budget WHERE id = 1", ())

    def put_power_budget(self, doc: dict[str, Any] | None) -> None:
        """Store the budget's settings (None: remove them)."""
        if doc is None:
            self._write("DELETE FROM power_budget", ())
        else:
            self._write(_PUT_BUDGET, (1, json.dumps(doc), time.time()))

    def job_lifecycles(self) -> dict[str, tuple[str, float, str]]:
        """Per job, its stored lifecycle ``(state, since, reason)`` (jobs never stored: absent)."""
        rows = self._rows("SELECT job_id, state, since, reason FROM job_lifecycle")
        return {str(r[0]): (str(r[1]), float(r[2]), str(r[3])) for r in rows}

    def put_job_lifecycle(self, job_id: str, state: str, since: float, reason: str) -> None:
        """Store (or replace) a job's lifecycle; deleting the job removes it."""
        self._write(_PUT_LIFECYCLE, (job_id, state, since, reason))
