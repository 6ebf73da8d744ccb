"""The PostgreSQL store: the store protocol on a database server.

It implements :class:`~perseus_server.domain.store.Store` (``perseus serve --db
postgresql://user@host/db``), for deployments that already run PostgreSQL and want the server's
state off its machine.

The same contract as the SQLite store (transactions that nest, rollback, after-commit
callbacks, ordering; one contract suite runs on both), with these differences:

- **Threads.** Unlike the SQLite store, this one may be used from several threads at once: each
  thread's transaction runs on its own connection of a pool (``psycopg_pool``), and a read
  outside of a transaction borrows any free one. The server uses this to commit iteration reports
  off the event loop (:class:`~perseus_server.service.ingest.ReportWriter`).
- **Concurrency.** Writes of different threads are isolated by PostgreSQL (``READ COMMITTED``);
  every write is one statement or reads what it changes under a row lock, so two writers
  never lose an update (a profile's revision counts up once per write). Iterations written for a
  job that was deleted meanwhile are dropped (the job row is read ``FOR SHARE`` first).
- **Durability.** A commit is durable when PostgreSQL says so (``synchronous_commit`` of the
  database: ``on`` by default, which survives the database server's crash as well).
- **The database lost.** A write whose connection fails (the database restarted, the network
  cut, the connection terminated, no connection to be had from the pool) is refused with the
  retryable :class:`~perseus_server.domain.errors.StoreUnavailable` (``kind:
  database_unreachable``: REST 503, gRPC ``UNAVAILABLE``), counted like a full disk; nothing of
  it was committed, so nothing acknowledged is lost. A leader that stays cut off loses its lease
  (:mod:`perseus_server.runtime.leadership`).

The pool, the transactions, the fencing and the refusals are
:class:`~perseus_server.runtime.postgres_connection.PostgresConnection`'s, this store's base.
Schema versions: :meth:`PostgresStore.open` brings the database to this code's version with
:mod:`perseus_server.runtime.postgres_migrations`.
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
    IterationRow,
    JobRow,
    RankIteration,
    TenantRow,
)
from perseus_server.domain.states import SolveStatus
from perseus_server.domain.store import StoreError
from perseus_server.runtime.leadership import NotLeader
from perseus_server.runtime.postgres_connection import PostgresConnection
from perseus_server.runtime.postgres_migrations import SCHEMA_VERSION
from perseus_server.runtime.store_rows import JOB_TABLES, rank_from_json

__all__ = ["SCHEMA_VERSION", "NotLeader", "PostgresStore", "StoreError"]

_CREDENTIAL_COLUMNS = "id, scope, job_id, hash, created, rotated, revoked, tenant"
_TENANT_COLUMNS = "id, created, max_jobs, max_gpus, weight, guaranteed_watts"
_FRONTIER_COLUMNS = (
    "status, progress, error, doc, profile_revision, started, finished, solve_seconds, partial"
)


class PostgresStore(PostgresConnection):
    """PostgreSQL persistence of the server state (a :class:`~perseus_server.domain.store.Store`).

    Open with :meth:`open` (a ``postgresql://`` URL); close with :meth:`close`. The pool, the
    transactions and the fencing are :class:`PostgresConnection`'s; the tables are here.
    """

    #: Safe to call from several threads at once (see the module docstring).
    thread_safe = True

    # --- jobs ------------------------------------------------------------------------------------

    def add_job(self, job_id: str, spec: JobSpec, tenant: str = DEFAULT_TENANT) -> JobRow:
        """Store a new job of ``tenant`` (``job_id`` not stored yet); returns its row."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs (id, created, spec, tenant) VALUES (%s, %s, %s, %s)",
                (job_id, now, json.dumps(spec.to_json()), tenant),
            )
        return JobRow(job_id, now, spec, tenant)

    def jobs(self, on_error: Callable[[str, Exception], None] | None = None) -> list[JobRow]:
        """Every job whose description can be read, oldest first."""
        out = []
        for r in self._rows("SELECT id, created, spec, tenant FROM jobs ORDER BY created, id"):
            try:
                out.append(JobRow(r[0], r[1], JobSpec.from_json(json.loads(r[2])), str(r[3])))
            except Exception as e:
                if on_error is None:
                    raise
                on_error(str(r[0]), e)
        return out

    def count_jobs(self) -> int:
        """The number of stored jobs."""
        return int(self._row("SELECT COUNT(*) FROM jobs")[0])

    def delete_job(self, job_id: str) -> None:
        """Forget the job and everything stored of it."""
        with self._tx() as db:
            for table, col in JOB_TABLES:
                db.execute(f"DELETE FROM {table} WHERE {col} = %s", (job_id,))

    # --- profiles, frontiers, deployments, profiling sessions ------------------------------------

    def put_profile(self, job_id: str, csv_text: str, source: str) -> int:
        """Store the job's profile (canonical CSV); returns its new revision (1, 2, ...)."""
        with self._tx() as db:
            row = db.execute(
                "INSERT INTO profiles (job_id, csv, revision, updated, source) "
                "VALUES (%s, %s, 1, %s, %s) ON CONFLICT (job_id) DO UPDATE SET csv = excluded.csv, "
                "revision = profiles.revision + 1, updated = excluded.updated, "
                "source = excluded.source RETURNING revision",
                (job_id, csv_text, time.time(), source),
            ).fetchone()
        return int(row[0])

    def profile(self, job_id: str) -> tuple[str, int, str] | None:
        """``(csv, revision, source)``, or None."""
        row = self._row("SELECT csv, revision, source FROM profiles WHERE job_id = %s", (job_id,))
        return None if row is None else (row[0], int(row[1]), row[2])

    def frontier(self, job_id: str) -> FrontierRow:
        """The job's frontier state (a default row when none is stored)."""
        row = self._row(f"SELECT {_FRONTIER_COLUMNS} FROM frontiers WHERE job_id = %s", (job_id,))
        return FrontierRow() if row is None else FrontierRow(*row)

    def put_frontier(self, job_id: str, row: FrontierRow) -> None:
        """Store the job's frontier state (replacing any)."""
        values = (
            job_id,
            row.status.value,
            row.progress,
            row.error,
            row.doc,
            row.profile_revision,
            row.started,
            row.finished,
            row.solve_seconds,
            bool(row.partial),
        )
        with self._tx() as db:
            db.execute(
                f"INSERT INTO frontiers (job_id, {_FRONTIER_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (job_id) DO UPDATE "
                "SET " + ", ".join(f"{c} = excluded.{c}" for c in _FRONTIER_COLUMNS.split(", ")),
                values,
            )

    def interrupted_solves(self) -> list[str]:
        """The jobs whose stored frontier state is queued, running or partial."""
        rows = self._rows(
            "SELECT job_id FROM frontiers WHERE status IN (%s, %s, %s) ORDER BY job_id",
            (SolveStatus.QUEUED.value, SolveStatus.RUNNING.value, SolveStatus.PARTIAL.value),
        )
        return [r[0] for r in rows]

    def deployment(self, job_id: str) -> tuple[int, dict[str, Any]] | None:
        """``(plan version, deployment document)``, or None."""
        row = self._row("SELECT version, doc FROM deployments WHERE job_id = %s", (job_id,))
        return None if row is None else (int(row[0]), json.loads(row[1]))

    def put_deployment(self, job_id: str, version: int, doc: dict[str, Any]) -> None:
        """Store the job's deployment document as ``version``."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO deployments (job_id, version, doc, updated) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (job_id) DO UPDATE SET version = excluded.version, "
                "doc = excluded.doc, updated = excluded.updated",
                (job_id, version, json.dumps(doc), time.time()),
            )

    def profiling(self, job_id: str) -> dict[str, Any] | None:
        """The job's online-profiling session document, or None."""
        row = self._row("SELECT doc FROM profiling WHERE job_id = %s", (job_id,))
        return None if row is None else json.loads(row[0])

    def put_profiling(self, job_id: str, doc: dict[str, Any]) -> None:
        """Store the job's online-profiling session document."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO profiling (job_id, doc) VALUES (%s, %s) "
                "ON CONFLICT (job_id) DO UPDATE SET doc = excluded.doc",
                (job_id, json.dumps(doc)),
            )

    # --- ranks and their iterations --------------------------------------------------------------

    def ranks(self, job_id: str) -> list[RankInfo]:
        """The job's registered ranks by global rank."""
        rows = self._rows(
            "SELECT info FROM ranks WHERE job_id = %s ORDER BY global_rank", (job_id,)
        )
        return [rank_from_json(job_id, json.loads(r[0])) for r in rows]

    def put_rank(self, rank: RankInfo) -> None:
        """Store (or replace) the rank in its job's slot ``global_rank``."""
        with self._tx() as db:
            # As SQLite's INSERT OR REPLACE: the row of the slot and any row of the identity go.
            db.execute(
                "DELETE FROM ranks WHERE (job_id = %s AND global_rank = %s) OR rank_id = %s",
                (rank.job_id, rank.global_rank, rank.rank_id),
            )
            db.execute(
                "INSERT INTO ranks (job_id, global_rank, rank_id, info, registered) "
                "VALUES (%s, %s, %s, %s, %s)",
                (
                    rank.job_id,
                    rank.global_rank,
                    rank.rank_id,
                    json.dumps(rank.to_json()),
                    time.time(),
                ),
            )

    def add_iterations(
        self,
        job_id: str,
        rows: list[IterationRow],
        keep: int,
        sequences: dict[tuple[str, int], int] | None = None,
        incarnations_kept: int = 8,
    ) -> None:
        """Append iterations, keep the newest ``keep`` per rank, and raise the report sequences."""
        if not rows:
            return
        now = time.time()
        with self._tx() as db:
            # A job deleted meanwhile (by another thread) keeps nothing; a job being deleted
            # waits for this transaction, then removes what it wrote. Writers of one job's
            # iterations take turns (each numbers its rows after the last one stored).
            job = db.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (job_id,)).fetchone()
            if job is None:
                return
            if sequences:
                self._raise_sequences(db, job_id, sequences, now, incarnations_kept)
            ranks = sorted({r[0] for r in rows})
            last = dict(
                db.execute(
                    "SELECT r.rank_id, COALESCE((SELECT MAX(n) FROM iterations i "
                    "WHERE i.rank_id = r.rank_id), 0) FROM unnest(%s::text[]) AS r(rank_id)",
                    (ranks,),
                ).fetchall()
            )
            numbers = []
            for r, *_ in rows:
                last[r] += 1
                numbers.append(last[r])
            columns = list(zip(*rows, strict=True))
            db.execute(
                "INSERT INTO iterations (rank_id, job_id, n, iteration, time, energy, plan_version, "
                "received) SELECT r, %s, n, it, t, e, v, %s FROM unnest(%s::text[], %s::bigint[], "
                "%s::bigint[], %s::float8[], %s::float8[], %s::bigint[]) AS x(r, n, it, t, e, v)",
                (job_id, now, list(columns[0]), numbers, *(list(c) for c in columns[1:])),
            )
            # Each rank keeps its newest ``keep``: a range of its own numbers goes.
            db.execute(
                "DELETE FROM iterations i USING unnest(%s::text[], %s::bigint[]) AS c(rank_id, cut) "
                "WHERE i.rank_id = c.rank_id AND i.n <= c.cut",
                (ranks, [last[r] - keep for r in ranks]),
            )

    @staticmethod
    def _raise_sequences(
        db: Any, job_id: str, sequences: dict[tuple[str, int], int], now: float, kept: int
    ) -> None:
        """Raise each ``(rank, incarnation)``'s highest sequence (never lower it).

        A rank that gained an incarnation keeps its ``kept`` most recently updated ones.
        """
        keys = list(sequences)
        got = db.execute(
            "INSERT INTO report_sequences (rank_id, incarnation, job_id, last, updated) "
            "SELECT r, inc, %s, s, %s FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) "
            "AS x(r, inc, s) ON CONFLICT (rank_id, incarnation) DO UPDATE "
            "SET last = GREATEST(report_sequences.last, excluded.last), updated = excluded.updated "
            "RETURNING rank_id, (xmax = 0) AS inserted",
            (
                job_id,
                now,
                [r for r, _ in keys],
                [int(inc) for _, inc in keys],
                [int(sequences[k]) for k in keys],
            ),
        ).fetchall()
        grown = sorted({r for r, inserted in got if inserted})
        if grown:
            db.execute(
                "DELETE FROM report_sequences s USING (SELECT rank_id, incarnation, row_number() "
                "OVER (PARTITION BY rank_id ORDER BY updated DESC, seq DESC) AS k "
                "FROM report_sequences WHERE rank_id = ANY(%s)) x "
                "WHERE s.rank_id = x.rank_id AND s.incarnation = x.incarnation AND x.k > %s",
                (grown, kept),
            )

    def report_sequences(self, job_id: str) -> dict[str, dict[int, int]]:
        """Per rank of the job, the highest accepted report sequence of each incarnation."""
        out: dict[str, dict[int, int]] = {}
        for rank_id, incarnation, last in self._rows(
            "SELECT rank_id, incarnation, last FROM report_sequences WHERE job_id = %s "
            "ORDER BY updated, seq",
            (job_id,),
        ):
            out.setdefault(str(rank_id), {})[int(incarnation)] = int(last)
        return out

    def iterations(self, rank_id: str, limit: int) -> list[RankIteration]:
        """The newest ``limit`` iterations of a rank, oldest first."""
        rows = self._rows(
            "SELECT iteration, time, energy, plan_version FROM iterations WHERE rank_id = %s "
            "ORDER BY n DESC LIMIT %s",
            (rank_id, limit),
        )
        return [(int(a), float(b), float(c), int(d)) for a, b, c, d in reversed(rows)]

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
        with self._tx() as db:
            db.execute(
                f"INSERT INTO credentials ({_CREDENTIAL_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, NULL, NULL, %s)",
                (credential_id, scope, job_id, digest, now, tenant),
            )
        return CredentialRow(credential_id, scope, job_id, digest, now, None, None, tenant)

    def credential_by_hash(self, digest: str) -> CredentialRow | None:
        """The credential whose secret has this digest, revoked or not."""
        row = self._row(f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials WHERE hash = %s", (digest,))
        return None if row is None else CredentialRow(*row)

    def credential(self, credential_id: str) -> CredentialRow | None:
        """The credential ``credential_id``, or None."""
        row = self._row(
            f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials WHERE id = %s", (credential_id,)
        )
        return None if row is None else CredentialRow(*row)

    def credentials(self, job_id: str | None = None) -> list[CredentialRow]:
        """Every credential (of one job when ``job_id`` is given), oldest first."""
        where, args = ("WHERE job_id = %s", (job_id,)) if job_id is not None else ("", ())
        rows = self._rows(
            f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials {where} ORDER BY created, id", args
        )
        return [CredentialRow(*r) for r in rows]

    def rotate_credential(self, credential_id: str, digest: str) -> None:
        """A new secret digest (the old one stops working); un-revokes."""
        with self._tx() as db:
            db.execute(
                "UPDATE credentials SET hash = %s, rotated = %s, revoked = NULL WHERE id = %s",
                (digest, time.time(), credential_id),
            )

    def revoke_credential(self, credential_id: str) -> bool:
        """Mark it revoked; False when it is unknown or was revoked already."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE credentials SET revoked = %s WHERE id = %s AND revoked IS NULL",
                (time.time(), credential_id),
            )
            return bool(cur.rowcount > 0)

    def bind_rank(self, rank_id: str, job_id: str, global_rank: int, credential_id: str) -> str:
        """Bind a rank identity (and its job's slot) to a credential unless bound already."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO rank_bindings (rank_id, job_id, global_rank, credential_id) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (rank_id, job_id, global_rank, credential_id),
            )
            row = db.execute(
                "SELECT credential_id FROM rank_bindings WHERE rank_id = %s "
                "OR (job_id = %s AND global_rank = %s) LIMIT 1",
                (rank_id, job_id, global_rank),
            ).fetchone()
        return str(row[0])

    def slot_binding(self, job_id: str, global_rank: int) -> str | None:
        """The credential the job's slot ``global_rank`` is bound to, or None."""
        row = self._row(
            "SELECT credential_id FROM rank_bindings WHERE job_id = %s AND global_rank = %s",
            (job_id, global_rank),
        )
        return None if row is None else str(row[0])

    def rank_binding(self, rank_id: str) -> tuple[str, str] | None:
        """``(job_id, credential_id)`` the rank identity is bound to, or None."""
        row = self._row(
            "SELECT job_id, credential_id FROM rank_bindings WHERE rank_id = %s", (rank_id,)
        )
        return None if row is None else (str(row[0]), str(row[1]))

    # --- tenants ---------------------------------------------------------------------------------

    def tenants(self) -> list[TenantRow]:
        """Every tenant, oldest first (ties by id). A new database holds the ``default`` one."""
        rows = self._rows(f"SELECT {_TENANT_COLUMNS} FROM tenants ORDER BY created, id")
        return [TenantRow(*r) for r in rows]

    def put_tenant(self, row: TenantRow) -> None:
        """Store a new tenant, or replace a stored one's quotas (keeping its ``created``)."""
        with self._tx() as db:
            db.execute(
                f"INSERT INTO tenants ({_TENANT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET max_jobs = excluded.max_jobs, "
                "max_gpus = excluded.max_gpus, weight = excluded.weight, "
                "guaranteed_watts = excluded.guaranteed_watts",
                (row.id, row.created, row.max_jobs, row.max_gpus, row.weight,
                 row.guaranteed_watts),
            )  # fmt: skip

    def delete_tenant(self, tenant_id: str) -> bool:
        """Forget a tenant and the credentials of its tenant; False when it is unknown."""
        with self._tx() as db:
            cur = db.execute("DELETE FROM tenants WHERE id = %s", (tenant_id,))
            db.execute("DELETE FROM credentials WHERE tenant = %s", (tenant_id,))
            return bool(cur.rowcount > 0)

    # --- the cluster power budget ----------------------------------------------------------------

    def power_budget(self) -> dict[str, Any] | None:
        """The cluster power budget's settings, or None when none is set."""
        row = self._row("SELECT doc FROM power_budget WHERE id = 1")
        return None if row is None else json.loads(row[0])

    def put_power_budget(self, doc: dict[str, Any] | None) -> None:
        """Store the budget's settings (None: remove them)."""
        with self._tx() as db:
            if doc is None:
                db.execute("DELETE FROM power_budget")
            else:
                db.execute(
                    "INSERT INTO power_budget (id, doc, updated) VALUES (1, %s, %s) "
                    "ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, updated = excluded.updated",
                    (json.dumps(doc), time.time()),
                )

    # --- job lifecycles --------------------------------------------------------------------------

    def job_lifecycles(self) -> dict[str, tuple[str, float, str]]:
        """Per job, its stored lifecycle ``(state, since, reason)`` (jobs never stored: absent)."""
        rows = self._rows("SELECT job_id, state, since, reason FROM job_lifecycle")
        return {str(r[0]): (str(r[1]), float(r[2]), str(r[3])) for r in rows}

    def put_job_lifecycle(self, job_id: str, state: str, since: float, reason: str) -> None:
        """Store (or replace) a job's lifecycle; deleting the job removes it."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO job_lifecycle (job_id, state, since, reason) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, "
                "since = excluded.since, reason = excluded.reason",
                (job_id, state, since, reason),
            )
