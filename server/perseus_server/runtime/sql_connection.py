"""The store's connection to its database: transactions per thread, fencing, refusals.

:class:`SqlConnection` is what :class:`~perseus_server.runtime.sql_store.SqlStore` builds its
tables on, for SQLite and PostgreSQL alike (a SQLAlchemy engine, :func:`~perseus_server.runtime.
stores.engine_for`). It opens the engine and migrates the schema
(:mod:`perseus_server.runtime.schema`), runs each thread's transactions on a connection of its
own (they nest; after-commit callbacks run once the outermost commits), checks the leadership
epoch in every transaction once fenced (PostgreSQL), and turns a full disk or a database lost
into the retryable :class:`~perseus_server.domain.errors.StoreUnavailable`
(:mod:`perseus_server.runtime.store_errors`). See the store's module docstring for the contract.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, Self

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from perseus_server.domain.store import StoreError
from perseus_server.runtime.leadership import NotLeader
from perseus_server.runtime.schema import migrate
from perseus_server.runtime.store_errors import refusal
from perseus_server.runtime.stores import describe, engine_for

__all__ = ["SqlConnection"]

log = logging.getLogger("perseus.server")


class _Thread(threading.local):
    """One thread's transaction: its connection, depth and after-commit callbacks."""

    def __init__(self) -> None:
        self.conn: sa.Connection | None = None
        self.depth = 0
        self.after: list[Callable[[], object]] = []


class SqlConnection:
    """An engine on one database, with per-thread transactions.

    Open with :meth:`open` (a ``--db`` target); close with :meth:`close`.
    """

    def __init__(self, engine: sa.Engine, url: str) -> None:
        self.engine = engine
        #: The database as ``--db`` named it (a PostgreSQL URL: what the leadership connects to).
        self.url = url
        self.postgres = engine.dialect.name == "postgresql"
        #: Safe to call from several threads at once (PostgreSQL: a pool; SQLite: one connection).
        self.thread_safe = self.postgres
        #: ``INSERT ... ON CONFLICT`` in the database's dialect (the two take the same calls).
        self.insert: Any = postgresql.insert if self.postgres else sqlite.insert
        self._begin = "BEGIN" if self.postgres else "BEGIN IMMEDIATE"
        self._local = _Thread()
        #: The leadership epoch every write checks (None: not fenced; see :meth:`fence`).
        self.epoch: int | None = None
        #: How long a fenced transaction may wait on this server between statements (s).
        self.idle_limit: float | None = None
        #: Told the kind of every write refused (``disk_full``, ``database_unreachable``).
        self.on_error: Callable[[str], None] = lambda kind: None

    @classmethod
    def open(cls, target: str | Path, *, pool_size: int = 4, timeout: float = 10.0) -> Self:
        """Connect to the database ``target`` names and migrate its schema.

        Raises :class:`StoreError` when the database cannot be reached in ``timeout`` seconds or
        was written by a newer server.
        """
        engine = engine_for(target, pool_size=pool_size, timeout=timeout)
        try:
            migrate(engine)
        except BaseException as e:
            engine.dispose()
            if isinstance(e, sa.exc.DBAPIError | sa.exc.TimeoutError):
                raise StoreError(f"cannot use the database {describe(target)}: {e}") from e
            raise
        return cls(engine, str(target))

    def close(self) -> None:
        """Flush and release the database; the store is not used afterwards."""
        if not self.postgres:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        self.engine.dispose()

    def fence(self, epoch: int, idle_limit: float | None = None) -> None:
        """Commit from now on only while ``epoch`` is the database's leadership epoch.

        Otherwise a transaction raises :class:`NotLeader` and writes nothing
        (:mod:`perseus_server.runtime.leadership`, PostgreSQL). A new leader's epoch waits for
        the transactions under the old one to end, so every commit of an epoch precedes the next.

        ``idle_limit`` (the lease, say): PostgreSQL ends a transaction of this store that waits
        on the server longer than this between statements (nothing of it acknowledged), so a
        leader hung in a transaction cannot hold the epoch row for as long as the hang lasts.
        """
        self.epoch = epoch
        self.idle_limit = idle_limit

    def __str__(self) -> str:
        return describe(self.url)

    # --- transactions ----------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction around every write of this thread inside.

        Transactions nest: inner ones join the outer. Callbacks given to
        :meth:`after_commit` meanwhile run once it has committed.
        """
        with self._tx():
            yield

    def after_commit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` once the outermost transaction commits (at once outside of one)."""
        st = self._local
        if st.depth == 0:
            fn()
        else:
            st.after.append(fn)

    @contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        st = self._local
        if st.conn is not None:
            st.depth += 1
            try:
                yield st.conn
            finally:
                st.depth -= 1
            return
        conn = self._connect()
        try:
            self._outermost(conn, st)
            try:
                yield conn
                st.conn, st.depth = None, 0
                conn.exec_driver_sql("COMMIT")
            except BaseException as e:
                st.conn, st.depth = None, 0
                st.after.clear()
                self._rollback(conn)
                self._refuse(e)
        finally:
            st.conn, st.depth = None, 0
            conn.close()
        after, st.after = st.after, []
        for fn in after:
            fn()

    def _connect(self) -> sa.Connection:
        try:
            return self.engine.connect()
        except BaseException as e:
            self._refuse(e)

    def _outermost(self, conn: sa.Connection, st: _Thread) -> None:
        """Begin this thread's outermost transaction on ``conn`` (checking the epoch)."""
        try:
            conn.exec_driver_sql(self._begin)
            st.conn, st.depth = conn, 1
            if self.epoch is not None:
                self._check_epoch(conn)
        except BaseException as e:
            st.conn, st.depth = None, 0
            self._rollback(conn)
            self._refuse(e)

    def _rollback(self, conn: sa.Connection) -> None:
        try:
            conn.exec_driver_sql("ROLLBACK")
        except Exception:  # nothing to roll back, or the connection is gone
            if not self.postgres:
                log.debug("store %s: nothing to roll back", self)

    def _refuse(self, e: BaseException) -> NoReturn:
        """Raise ``e``, or the retryable error for a full disk or a database lost (counted)."""
        refused = refusal(e, str(self))
        if refused is None:
            raise e
        self.on_error(refused.kind)
        raise refused from e

    def _check_epoch(self, conn: sa.Connection) -> None:
        limit = "0" if self.idle_limit is None else f"{max(1, round(self.idle_limit * 1000))}ms"
        row = conn.execute(
            sa.text(
                "SELECT epoch, set_config('idle_in_transaction_session_timeout', :limit, true) "
                "FROM perseus_epoch WHERE id = 1 FOR SHARE"
            ),
            {"limit": limit},
        ).first()
        if row is None or int(row[0]) != self.epoch:
            raise NotLeader(
                f"this server is no longer the leader (its epoch {self.epoch}, the database's "
                f"{None if row is None else int(row[0])}); nothing was written"
            )

    # --- reads -----------------------------------------------------------------------------------

    def _rows(self, stmt: sa.Executable) -> list[Any]:
        """Every row of a query: on this thread's transaction if one is open, else on its own."""
        conn = self._local.conn
        if conn is not None:
            return list(conn.execute(stmt).all())
        with self.engine.connect() as c:
            return list(c.execute(stmt).all())

    def _row(self, stmt: sa.Executable) -> Any:
        rows = self._rows(stmt)
        return rows[0] if rows else None
