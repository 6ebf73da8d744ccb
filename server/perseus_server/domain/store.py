"""What the service needs of its persistence: the :class:`Store` protocol.

The service names only this protocol, and only what its callers use.
:class:`~perseus_server.runtime.sql_store.SqlStore` implements it once for SQLite (the embedded
default) and PostgreSQL, and one contract test suite
(``tests/server/runtime/test_sql_store_contract.py``) runs against both, the latter on a real
PostgreSQL server. ``--db`` chooses (:mod:`perseus_server.runtime.stores`).

**Transactions.** Every write method is atomic on its own. :meth:`Store.transaction` groups
writes into one transaction:

- *Nesting.* Transactions nest: an inner ``transaction()`` (or a write method called inside one)
  joins the outermost one; only the outermost commits.
- *Rollback.* An exception escaping any level rolls back every write since the outermost began,
  and propagates; nothing of it is visible afterwards, to this store or to a store reopened on
  the same database.
- *After commit.* A callback given to :meth:`Store.after_commit` inside a transaction runs once,
  right after the outermost transaction commits (in the order given), and never when it rolls
  back; outside of a transaction it runs at once. The service publishes a plan to the ranks
  this way: they hear of a version only once it is stored.

**Durability.** A write acknowledged (its outermost transaction committed) survives a killed
process. **Threads.** The store is used from the server's event-loop thread, and a store
that says ``thread_safe = True`` (PostgreSQL's) also from one more (report commits,
:mod:`perseus_server.service.ingest`): each thread's transactions are its own.

**Ordering.** :meth:`Store.jobs`, :meth:`Store.credentials` and :meth:`Store.tenants` are
oldest first (ties by id); :meth:`Store.ranks` by global rank; :meth:`Store.iterations` oldest
first.

**Schema.** Opening a database brings an older one to the current schema revision, keeping its
data (:mod:`perseus_server.runtime.schema`), and refuses one written by a newer server with
:class:`StoreError`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import (
    CredentialRow,
    FrontierRow,
    IterationRow,
    JobRow,
    RankIteration,
    TenantRow,
)

__all__ = ["Store", "StoreError"]


class StoreError(RuntimeError):
    """The database cannot be used by this server (written by a newer one)."""


class Store(Protocol):
    """The server state's persistence (see the module docstring for the contract)."""

    def close(self) -> None:
        """Flush and release the database; the store is not used afterwards."""

    # --- transactions ----------------------------------------------------------------------------

    def transaction(self) -> AbstractContextManager[None]:
        """One transaction around every write inside; an exception rolls all of it back.

        Transactions nest: inner ones join the outermost.
        """
        ...

    def after_commit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once the outermost transaction commits (at once outside of one).

        Dropped on rollback.
        """

    # --- jobs ------------------------------------------------------------------------------------

    def add_job(self, job_id: str, spec: JobSpec, tenant: str = "default") -> JobRow:
        """Store a new job of ``tenant`` (``job_id`` not stored yet); returns its row.

        The row's ``tenant`` is what :meth:`jobs` reads back.
        """
        ...

    def jobs(self, on_error: Callable[[str, Exception], None] | None = None) -> list[JobRow]:
        """Every job whose description can be read, oldest first.

        ``on_error(id, exc)`` hears of the others (without it, an unreadable row raises).
        """
        ...

    def delete_job(self, job_id: str) -> None:
        """Forget the job and everything stored of it.

        Profile, frontier, deployment, ranks, iterations, profiling, report sequences, its
        credentials and rank bindings.
        """

    # --- profiles, frontiers, deployments, profiling sessions ------------------------------------

    def put_profile(self, job_id: str, csv_text: str, source: str) -> int:
        """Store the job's profile (canonical CSV); returns its new revision (1, 2, ...)."""
        ...

    def profile(self, job_id: str) -> tuple[str, int, str] | None:
        """``(csv, revision, source)``, or None."""
        ...

    def frontier(self, job_id: str) -> FrontierRow:
        """The job's frontier state (a default row when none is stored)."""
        ...

    def put_frontier(self, job_id: str, row: FrontierRow) -> None:
        """Store the job's frontier state (replacing any)."""
        ...

    def interrupted_solves(self) -> list[str]:
        """The jobs whose stored frontier state is queued, running or partial."""
        ...

    def deployment(self, job_id: str) -> tuple[int, dict[str, Any]] | None:
        """``(plan version, deployment document)``, or None."""
        ...

    def put_deployment(self, job_id: str, version: int, doc: dict[str, Any]) -> None:
        """Store the job's deployment document as ``version``."""
        ...

    def profiling(self, job_id: str) -> dict[str, Any] | None:
        """The job's online-profiling session document, or None."""
        ...

    def put_profiling(self, job_id: str, doc: dict[str, Any]) -> None:
        """Store the job's online-profiling session document."""
        ...

    # --- ranks and their iterations --------------------------------------------------------------

    def ranks(self, job_id: str) -> list[RankInfo]:
        """The job's registered ranks by global rank."""
        ...

    def put_rank(self, rank: RankInfo) -> None:
        """Store (or replace) the rank in its job's slot ``global_rank``."""

    def add_iterations(
        self,
        job_id: str,
        rows: list[IterationRow],
        keep: int,
        sequences: dict[tuple[str, int], int] | None = None,
        incarnations_kept: int = 8,
    ) -> None:
        """Append iterations, keep the newest ``keep`` per rank, and raise the report sequences.

        The highest accepted report sequence of each ``(rank_id, incarnation)`` is raised to
        ``sequences`` (never lowered), keeping the ``incarnations_kept`` most recently
        updated incarnations of each rank, in the same transaction.
        """

    def report_sequences(self, job_id: str) -> dict[str, dict[int, int]]:
        """Per rank of the job, the highest accepted report sequence of each incarnation."""
        ...

    def iterations(self, rank_id: str, limit: int) -> list[RankIteration]:
        """The newest ``limit`` iterations of a rank, oldest first."""
        ...

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
        ...

    def credential_by_hash(self, digest: str) -> CredentialRow | None:
        """The credential whose secret has this digest, revoked or not."""
        ...

    def credentials(self, job_id: str | None = None) -> list[CredentialRow]:
        """Every credential (of one job when ``job_id`` is given), oldest first."""
        ...

    def rotate_credential(self, credential_id: str, digest: str) -> None:
        """A new secret digest (the old one stops working); un-revokes."""

    def revoke_credential(self, credential_id: str) -> bool:
        """Mark it revoked; False when it is unknown or was revoked already."""
        ...

    def bind_rank(self, rank_id: str, job_id: str, global_rank: int, credential_id: str) -> str:
        """Bind a rank identity (and its job's slot) to a credential unless bound already.

        Returns the credential it is bound to.
        """
        ...

    def slot_binding(self, job_id: str, global_rank: int) -> str | None:
        """The credential the job's slot ``global_rank`` is bound to, or None."""
        ...

    def rank_binding(self, rank_id: str) -> tuple[str, str] | None:
        """``(job_id, credential_id)`` the rank identity is bound to, or None."""
        ...

    # --- tenants ---------------------------------------------------------------------------------

    def tenants(self) -> list[TenantRow]:
        """Every tenant, oldest first (ties by id). A new database holds the ``default`` one."""
        ...

    def put_tenant(self, row: TenantRow) -> None:
        """Store a new tenant, or replace a stored one's quotas (keeping its ``created``)."""

    def delete_tenant(self, tenant_id: str) -> bool:
        """Forget a tenant and the credentials of its tenant; False when it is unknown.

        Its jobs are not touched (the service refuses to delete a tenant that has any).
        """
        ...

    # --- the cluster power budget ----------------------------------------------------------------

    def power_budget(self) -> dict[str, Any] | None:
        """The cluster power budget's settings, or None when none is set."""
        ...

    def put_power_budget(self, doc: dict[str, Any] | None) -> None:
        """Store the budget's settings (None: remove them)."""

    # --- job lifecycles ----------------------------------------------------------------------

    def job_lifecycles(self) -> dict[str, tuple[str, float, str]]:
        """Per job, its stored lifecycle ``(state, since, reason)`` (jobs never stored: absent)."""
        ...

    def put_job_lifecycle(self, job_id: str, state: str, since: float, reason: str) -> None:
        """Store (or replace) a job's lifecycle; deleting the job removes it."""
