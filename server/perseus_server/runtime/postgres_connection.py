"""The PostgreSQL store's connection: a pool, transactions per thread, fencing, a database lost.

:class:`PostgresConnection` is what :class:`~perseus_server.runtime.postgres_store.PostgresStore`
builds its tables on: it opens the pool and migrates the schema, runs each thread's
transactions on a connection of its own (they nest; after-commit callbacks run once the
outermost commits), checks the leadership epoch in every transaction once fenced, and turns a
database lost into the retryable :class:`~perseus_server.domain.errors.StoreUnavailable`. See
the store's module docstring for the contract.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, Self

from perseus_server.domain.errors import StoreUnavailable
from perseus_server.domain.store import StoreError
from perseus_server.runtime.leadership import NotLeader
from perseus_server.runtime.postgres_migrations import migrate
from perseus_server.runtime.stores import describe

__all__ = ["UNREACHABLE_RETRY_SECONDS", "PostgresConnection"]

#: What ``Retry-After`` says when the database cannot be reached (s): a failover takes a lease.
UNREACHABLE_RETRY_SECONDS = 5

log = logging.getLogger("perseus.server")


class _Thread(threading.local):
    """One thread's transaction: its connection, depth and after-commit callbacks."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.depth = 0
        self.after: list[Callable[[], object]] = []


class PostgresConnection:
    """A pool of connections to one PostgreSQL database, with per-thread transactions.

    Open with :meth:`open` (a ``postgresql://`` URL); close with :meth:`close`.
    """

    def __init__(self, pool: Any, url: str) -> None:
        self._pool = pool
        self.url = url
        self._local = _Thread()
        #: The leadership epoch every write checks (None: not fenced; see :meth:`fence`).
        self.epoch: int | None = None
        #: How long a fenced transaction may wait on this server between statements (s).
        self.idle_limit: float | None = None
        #: Told the kind of every write refused (``database_unreachable``); the service counts.
        self.on_error: Callable[[str], None] = lambda kind: None

    def fence(self, epoch: int, idle_limit: float | None = None) -> None:
        """Commit from now on only while ``epoch`` is the database's leadership epoch.

        Otherwise a transaction raises :class:`NotLeader` and writes nothing
        (:mod:`perseus_server.runtime.leadership`). A new leader's epoch waits for the transactions
        under the old one to end, so every commit of an epoch precedes the next epoch.

        ``idle_limit`` (the lease, say): PostgreSQL ends a transaction of this store that waits
        on the server longer than this between statements (its session is terminated, the
        transaction rolled back, nothing of it acknowledged). A leader hung in the middle of
        a transaction (SIGSTOP, a paused machine) would otherwise hold the epoch row, and the
        new leader's epoch would wait for it for as long as the hang lasts.
        """
        self.epoch = epoch
        self.idle_limit = idle_limit

    @classmethod
    def open(cls, url: str, *, pool_size: int = 4, timeout: float = 10.0) -> Self:
        """Connect (a pool of up to ``pool_size`` connections) and migrate the schema.

        Raises :class:`StoreError` when the database cannot be reached in ``timeout``
        seconds or was written by a newer server.
        """
        import psycopg
        from psycopg_pool import ConnectionPool, PoolTimeout

        pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={"autocommit": True},
            open=False,
            name="perseus-store",
        )
        try:
            pool.open(wait=True, timeout=timeout)
        except PoolTimeout:
            pool.close()
            raise StoreError(
                f"cannot connect to the database {describe(url)} within {timeout:g} s"
            ) from None
        try:
            with pool.connection() as conn:
                migrate(conn)
        except BaseException as e:
            pool.close()
            if isinstance(e, psycopg.Error):
                raise StoreError(f"cannot use the database {describe(url)}: {e}") from e
            raise
        return cls(pool, url)

    def close(self) -> None:
        """Flush and release the database; the store is not used afterwards."""
        self._pool.close()

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
    def _tx(self) -> Iterator[Any]:
        st = self._local
        if st.depth > 0:
            st.depth += 1
            try:
                yield st.conn
            finally:
                st.depth -= 1
            return
        try:
            with self._pool.connection() as conn, conn.transaction():
                if self.epoch is not None:
                    self._check_epoch(conn)
                st.conn, st.depth = conn, 1
                try:
                    yield conn
                finally:
                    st.conn, st.depth = None, 0
        except BaseException as e:
            st.after.clear()
            self._refuse(e)
        after, st.after = st.after, []
        for fn in after:
            fn()

    def _refuse(self, e: BaseException) -> NoReturn:
        """Raise ``e``, or the retryable :class:`StoreUnavailable` for a database lost.

        A refusal is counted (``on_error``; see the module docstring).
        """
        import psycopg
        from psycopg_pool import PoolTimeout

        ended = psycopg.errors.IdleInTransactionSessionTimeout  # hung past the idle limit
        if not isinstance(e, psycopg.OperationalError | PoolTimeout | ended):
            raise e
        full = isinstance(e, psycopg.errors.DiskFull)
        kind = "disk_full" if full else "database_unreachable"
        what = "the database's disk is full" if full else "the database cannot be reached"
        log.warning("store %s: %s (%s); the write was refused", self, what, e)
        self.on_error(kind)
        raise StoreUnavailable(
            f"{what}; nothing of this request was stored: retry in {UNREACHABLE_RETRY_SECONDS} s",
            kind=kind,
            retry_after=UNREACHABLE_RETRY_SECONDS,
        ) from e

    def __str__(self) -> str:
        return describe(self.url)

    def _check_epoch(self, conn: Any) -> None:
        limit = "0" if self.idle_limit is None else f"{max(1, round(self.idle_limit * 1000))}ms"
        row = conn.execute(
            "SELECT epoch, set_config('idle_in_transaction_session_timeout', %s, true) "
            "FROM perseus_epoch WHERE id = 1 FOR SHARE",
            (limit,),
        ).fetchone()
        if row is None or int(row[0]) != self.epoch:
            raise NotLeader(
                f"this server is no longer the leader (its epoch {self.epoch}, the database's "
                f"{None if row is None else int(row[0])}); nothing was written"
            )

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """Every row of a query.

        On this thread's transaction if one is open, else on any connection.
        """
        conn = self._local.conn
        if conn is not None:
            return conn.execute(sql, args).fetchall()
        with self._pool.connection() as c:
            return c.execute(sql, args).fetchall()

    def _row(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        rows = self._rows(sql, args)
        return rows[0] if rows else None
