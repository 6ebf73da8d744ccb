"""The store: the server state in SQLite (the embedded default) or PostgreSQL, written once.

It implements :class:`~perseus_server.domain.store.Store` on the tables of
:mod:`perseus_server.runtime.store_tables` with SQLAlchemy Core, one statement for both
databases (``--db``: a file path or ``sqlite:///PATH``, or ``postgresql://user@host/db`` for
deployments that already run PostgreSQL or want two servers, active and standby). The
connection, the transactions, the fencing and the refusals are
:class:`~perseus_server.runtime.sql_connection.SqlConnection`'s, this store's base; the schema is
brought to this code's revision when a store opens (:mod:`perseus_server.runtime.schema`).

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

import sqlalchemy as sa

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import (
    DEFAULT_TENANT,
    CredentialRow,
    FrontierRow,
    JobRow,
    TenantRow,
)
from perseus_server.domain.states import SolveStatus
from perseus_server.runtime import store_tables as t
from perseus_server.runtime.sql_history import HistoryTables
from perseus_server.runtime.store_rows import rank_from_json

__all__ = ["SqlStore"]

_CREDENTIAL = (t.credentials.c.id, t.credentials.c.scope, t.credentials.c.job_id,
               t.credentials.c.hash, t.credentials.c.created, t.credentials.c.rotated,
               t.credentials.c.revoked, t.credentials.c.tenant)  # fmt: skip
_TENANT = tuple(t.tenants.c)
_FRONTIER = tuple(c for c in t.frontiers.c if c.name != "job_id")
_INTERRUPTED = (SolveStatus.QUEUED.value, SolveStatus.RUNNING.value, SolveStatus.PARTIAL.value)


def _fields(row: CredentialRow | TenantRow) -> dict[str, Any]:
    """A row object's fields by column name."""
    return {k: getattr(row, k) for k in row.__slots__}


class SqlStore(HistoryTables):
    """The server state's persistence (a :class:`~perseus_server.domain.store.Store`).

    Open with :meth:`open` (what ``--db`` names); close with :meth:`close`.
    """

    def _upsert(self, table: sa.Table, values: dict[str, Any], keys: tuple[str, ...]) -> None:
        """Insert ``values``, or replace the other columns of the row with the same ``keys``."""
        stmt = self.insert(table).values(values)
        rest = {k: stmt.excluded[k] for k in values if k not in keys}
        with self._tx() as db:
            db.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=rest))

    def _doc(self, table: sa.Table, job_id: str) -> dict[str, Any] | None:
        row = self._row(sa.select(table.c.doc).where(table.c.job_id == job_id))
        return None if row is None else json.loads(row[0])

    # --- jobs ------------------------------------------------------------------------------------

    def add_job(self, job_id: str, spec: JobSpec, tenant: str = DEFAULT_TENANT) -> JobRow:
        """Store a new job of ``tenant`` (``job_id`` not stored yet); returns its row."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                t.jobs.insert().values(
                    id=job_id, created=now, spec=json.dumps(spec.to_json()), tenant=tenant
                )
            )
        return JobRow(job_id, now, spec, tenant)

    def jobs(self, on_error: Callable[[str, Exception], None] | None = None) -> list[JobRow]:
        """Every job whose description can be read, oldest first.

        ``on_error(id, exc)`` hears of the others (without it, an unreadable row raises).
        """
        j = t.jobs.c
        out = []
        for r in self._rows(sa.select(j.id, j.created, j.spec, j.tenant).order_by(j.created, j.id)):
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
            for table, column in t.JOB_TABLES:
                db.execute(table.delete().where(column == job_id))

    # --- profiles, frontiers, deployments, profiling sessions ------------------------------------

    def put_profile(self, job_id: str, csv_text: str, source: str) -> int:
        """Store the job's profile (canonical CSV); returns its new revision (1, 2, ...)."""
        p = t.profiles
        stmt = self.insert(p).values(
            job_id=job_id, csv=csv_text, revision=1, updated=time.time(), source=source
        )
        x = stmt.excluded
        stmt = stmt.on_conflict_do_update(
            index_elements=["job_id"],
            set_={"csv": x.csv, "revision": p.c.revision + 1, "updated": x.updated,
                  "source": x.source},
        ).returning(p.c.revision)  # fmt: skip
        with self._tx() as db:
            return int(db.execute(stmt).scalar_one())

    def profile(self, job_id: str) -> tuple[str, int, str] | None:
        """``(csv, revision, source)``, or None."""
        p = t.profiles.c
        row = self._row(sa.select(p.csv, p.revision, p.source).where(p.job_id == job_id))
        return None if row is None else (row[0], int(row[1]), row[2])

    def frontier(self, job_id: str) -> FrontierRow:
        """The job's frontier state (a default row when none is stored)."""
        row = self._row(sa.select(*_FRONTIER).where(t.frontiers.c.job_id == job_id))
        return FrontierRow() if row is None else FrontierRow(*row)

    def put_frontier(self, job_id: str, row: FrontierRow) -> None:
        """Store the job's frontier state (replacing any)."""
        values = {c.name: getattr(row, c.name) for c in _FRONTIER}
        values["status"], values["partial"] = SolveStatus(row.status).value, bool(row.partial)
        self._upsert(t.frontiers, {"job_id": job_id, **values}, ("job_id",))

    def interrupted_solves(self) -> list[str]:
        """The jobs whose stored frontier state is queued, running or partial."""
        f = t.frontiers.c
        rows = self._rows(sa.select(f.job_id).where(f.status.in_(_INTERRUPTED)).order_by(f.job_id))
        return [r[0] for r in rows]

    def deployment(self, job_id: str) -> tuple[int, dict[str, Any]] | None:
        """``(plan version, deployment document)``, or None."""
        d = t.deployments.c
        row = self._row(sa.select(d.version, d.doc).where(d.job_id == job_id))
        return None if row is None else (int(row[0]), json.loads(row[1]))

    def put_deployment(self, job_id: str, version: int, doc: dict[str, Any]) -> None:
        """Store the job's deployment document as ``version``."""
        values = {"job_id": job_id, "version": version, "doc": json.dumps(doc),
                  "updated": time.time()}  # fmt: skip
        self._upsert(t.deployments, values, ("job_id",))

    def profiling(self, job_id: str) -> dict[str, Any] | None:
        """The job's online-profiling session document, or None."""
        return self._doc(t.profiling, job_id)

    def put_profiling(self, job_id: str, doc: dict[str, Any]) -> None:
        """Store the job's online-profiling session document."""
        self._upsert(t.profiling, {"job_id": job_id, "doc": json.dumps(doc)}, ("job_id",))

    # --- ranks -----------------------------------------------------------------------------------

    def ranks(self, job_id: str) -> list[RankInfo]:
        """The job's registered ranks by global rank."""
        r = t.ranks.c
        rows = self._rows(sa.select(r.info).where(r.job_id == job_id).order_by(r.global_rank))
        return [rank_from_json(job_id, json.loads(row[0])) for row in rows]

    def put_rank(self, rank: RankInfo) -> None:
        """Store (or replace) the rank in its job's slot ``global_rank``.

        The row of the slot and any row of the rank's identity are replaced.
        """
        r = t.ranks.c
        slot = sa.and_(r.job_id == rank.job_id, r.global_rank == rank.global_rank)
        with self._tx() as db:
            db.execute(t.ranks.delete().where(sa.or_(slot, r.rank_id == rank.rank_id)))
            db.execute(
                t.ranks.insert().values(
                    job_id=rank.job_id,
                    global_rank=rank.global_rank,
                    rank_id=rank.rank_id,
                    info=json.dumps(rank.to_json()),
                    registered=time.time(),
                )
            )

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
        row = CredentialRow(credential_id, scope, job_id, digest, time.time(), None, None, tenant)
        with self._tx() as db:
            db.execute(t.credentials.insert().values(_fields(row)))
        return row

    def credential_by_hash(self, digest: str) -> CredentialRow | None:
        """The credential whose secret has this digest, revoked or not."""
        row = self._row(sa.select(*_CREDENTIAL).where(t.credentials.c.hash == digest))
        return None if row is None else CredentialRow(*row)

    def credentials(self, job_id: str | None = None) -> list[CredentialRow]:
        """Every credential (of one job when ``job_id`` is given), oldest first."""
        c = t.credentials.c
        stmt = sa.select(*_CREDENTIAL).order_by(c.created, c.id)
        if job_id is not None:
            stmt = stmt.where(c.job_id == job_id)
        return [CredentialRow(*r) for r in self._rows(stmt)]

    def rotate_credential(self, credential_id: str, digest: str) -> None:
        """A new secret digest (the old one stops working); un-revokes."""
        c = t.credentials
        with self._tx() as db:
            db.execute(
                c.update()
                .where(c.c.id == credential_id)
                .values(hash=digest, rotated=time.time(), revoked=None)
            )

    def revoke_credential(self, credential_id: str) -> bool:
        """Mark it revoked; False when it is unknown or was revoked already."""
        c = t.credentials
        stmt = c.update().where(c.c.id == credential_id, c.c.revoked.is_(None))
        with self._tx() as db:
            return db.execute(stmt.values(revoked=time.time())).rowcount > 0

    def bind_rank(self, rank_id: str, job_id: str, global_rank: int, credential_id: str) -> str:
        """Bind a rank identity (and its job's slot) to a credential unless bound already.

        Returns the credential it is bound to (``credential_id`` or the earlier one).
        """
        b = t.rank_bindings
        insert = self.insert(b).values(
            rank_id=rank_id, job_id=job_id, global_rank=global_rank, credential_id=credential_id
        )
        bound = sa.or_(b.c.rank_id == rank_id, sa.and_(b.c.job_id == job_id,
                                                        b.c.global_rank == global_rank))  # fmt: skip
        with self._tx() as db:
            db.execute(insert.on_conflict_do_nothing())
            return str(db.execute(sa.select(b.c.credential_id).where(bound).limit(1)).scalar())

    def slot_binding(self, job_id: str, global_rank: int) -> str | None:
        """The credential the job's slot ``global_rank`` is bound to, or None."""
        b = t.rank_bindings.c
        row = self._row(
            sa.select(b.credential_id).where(b.job_id == job_id, b.global_rank == global_rank)
        )
        return None if row is None else str(row[0])

    def rank_binding(self, rank_id: str) -> tuple[str, str] | None:
        """``(job_id, credential_id)`` the rank identity is bound to, or None."""
        b = t.rank_bindings.c
        row = self._row(sa.select(b.job_id, b.credential_id).where(b.rank_id == rank_id))
        return None if row is None else (str(row[0]), str(row[1]))

    # --- tenants, the cluster power budget, job lifecycles ---------------------------------------

    def tenants(self) -> list[TenantRow]:
        """Every tenant, oldest first (ties by id). A new database holds the ``default`` one."""
        c = t.tenants.c
        return [TenantRow(*r) for r in self._rows(sa.select(*_TENANT).order_by(c.created, c.id))]

    def put_tenant(self, row: TenantRow) -> None:
        """Store a new tenant, or replace a stored one's quotas (keeping its ``created``)."""
        values = _fields(row)
        stmt = self.insert(t.tenants).values(values)
        quotas = {k: stmt.excluded[k] for k in values if k not in ("id", "created")}
        with self._tx() as db:
            db.execute(stmt.on_conflict_do_update(index_elements=["id"], set_=quotas))

    def delete_tenant(self, tenant_id: str) -> bool:
        """Forget a tenant and the credentials of its tenant; False when it is unknown.

        Its jobs are the caller's business (the service refuses to delete a tenant with any).
        """
        with self._tx() as db:
            gone = db.execute(t.tenants.delete().where(t.tenants.c.id == tenant_id)).rowcount
            db.execute(t.credentials.delete().where(t.credentials.c.tenant == tenant_id))
        return gone > 0

    def power_budget(self) -> dict[str, Any] | None:
        """The cluster power budget's settings, or None when none is set."""
        row = self._row(sa.select(t.power_budget.c.doc).where(t.power_budget.c.id == 1))
        return None if row is None else json.loads(row[0])

    def put_power_budget(self, doc: dict[str, Any] | None) -> None:
        """Store the budget's settings (None: remove them)."""
        if doc is None:
            with self._tx() as db:
                db.execute(t.power_budget.delete())
            return
        values = {"id": 1, "doc": json.dumps(doc), "updated": time.time()}
        self._upsert(t.power_budget, values, ("id",))

    def job_lifecycles(self) -> dict[str, tuple[str, float, str]]:
        """Per job, its stored lifecycle ``(state, since, reason)`` (jobs never stored: absent)."""
        rows = self._rows(sa.select(*t.job_lifecycle.c))
        return {str(r[0]): (str(r[1]), float(r[2]), str(r[3])) for r in rows}

    def put_job_lifecycle(self, job_id: str, state: str, since: float, reason: str) -> None:
        """Store (or replace) a job's lifecycle; deleting the job removes it."""
        values = {"job_id": job_id, "state": state, "since": since, "reason": reason}
        self._upsert(t.job_lifecycle, values, ("job_id",))
