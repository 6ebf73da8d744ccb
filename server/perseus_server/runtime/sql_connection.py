"""The store's connection to its database: transactions per thread, fencing, refusals.

:class:`SqlConnection` is what :class:`~perseus_server.runtime.sql_store.SqlStore` builds its
tables on, for SQLite and PostgreSQL alike. It migrates the schema when it opens
(:mod:`perseus_server.runtime.schema`, Alembic on a SQLAlchemy engine), then runs the store's
statements on the driver's own connections: SQLite's one connection (``sqlite3``, WAL mode) or a
pool of PostgreSQL connections (psycopg 3, ``psycopg_pool``). It runs each thread's
transactions on a connection of its own (they nest; after-commit callbacks run once the
outermost commits), checks the leadership epoch in every transaction once fenced (PostgreSQL),
and turns a full disk or a database lost into the retryable
:class:`~perseus_server.domain.errors.StoreUnavailable`
(:mod:`perseus_server.runtime.store_errors`).

**Why the driver's connections.** Measured side by side (``benchmarks/store_versions.py``,
``docs/results/2026-12-07-store.md``), SQLAlchemy's statement execution multiplied the cost of
each store call many times over on SQLite, and slowed report ingestion and the plan path far
past the 10 % the project allows. The statements are therefore one dialect-neutral SQL text
each (both databases take ``INSERT ... ON CONFLICT``, ``RETURNING`` and window functions); what
differs is said once here, in :class:`Db`: the placeholder (``?`` or ``%s``), how a write
transaction begins, and row locks.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn, Self

from perseus_server.domain.store import StoreError
from perseus_server.runtime.leadership import NotLeader
from perseus_server.runtime.schema import prepare
from perseus_server.runtime.store_errors import refusal
from perseus_server.runtime.stores import describe, is_postgres, sqlite_path

__all__ = ["Db", "SqlConnection"]

log = logging.getLogger("perseus.server")


@lru_cache(maxsize=256)
def _pyformat(sql: str) -> str:
    """``sql`` with psycopg's placeholders (the store writes SQLite's ``?``)."""
    return sql.replace("?", "%s")


class Db:
    """One connection as the store's statements use it, in either database's dialect."""

    __slots__ = ("conn", "postgres")

    def __init__(self, conn: Any, postgres: bool) -> None:
        self.conn = conn
        self.postgres = postgres

    def run(self, sql: str, args: Sequence[Any] = ()) -> Any:
        """Execute one statement (``?`` placeholders); returns the driver's cursor."""
        return self.conn.execute(_pyformat(sql) if self.postgres else sql, args)

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Execute one statement for each of ``rows``."""
        if self.postgres:
            with self.conn.cursor() as cur:
                cur.executemany(_pyformat(sql), rows)
        else:
            self.conn.executemany(sql, rows)

    @property
    def for_update(self) -> str:
        """A row lock's clause (SQLite's ``BEGIN IMMEDIATE`` holds the whole database's)."""
        return " FOR UPDATE" if self.postgres else ""


class _Thread(threading.local):
    """One thread's transaction: its connection, depth and after-commit callbacks."""

    def __init__(self) -> None:
        self.db: Db | None = None
        self.depth = 0
        self.after: list[Callable[[], object]] = []


class SqlConnection:
    """One database, with per-thread transactions.

    Open with :meth:`open` (a ``--db`` target); close with :meth:`close`.
    """

    def __init__(self, target: str | Path, pool: Any, single: sqlite3.Connection | None) -> None:
        #: The database as ``--db`` named it (a PostgreSQL URL: what the leadership connects to).
        self.url = str(target)
        self.postgres = single is None
        #: Safe to call from several threads at once (PostgreSQL: a pool; SQLite: one connection).
        self.thread_safe = self.postgres
        self._pool = pool
        self._single = single
        self._local = _Thread()
        #: The leadership epoch every write checks (None: not fenced; see :meth:`fence`).
        self.epoch: int | None = None
        #: How long a fenced transaction may wait on this server between statements (s).
        self.idle_limit: float | None = None
        #: Told the kind of every write refused (``disk_full``, ``database_unreachable``).
        self.on_error: Callable[[str], None] = lambda kind: None

    @classmethod
    def open(cls, target: str | Path, *, pool_size: int = 4, timeout: float = 10.0) -> Self:
        """Open the database ``target`` names and migrate its schema.

        Raises :class:`StoreError` when the database cannot be reached in ``timeout`` seconds or
        was written by a newer server.
        """
        if is_postgres(target):
            return cls(target, _pool(str(target), pool_size, timeout), None)
        conn = _sqlite(sqlite_path(target))
        try:
            prepare(conn, target, postgres=False)
        except BaseException:
            conn.close()
            raise
        return cls(target, None, conn)

    def close(self) -> None:
        """Flush and release the database; the store is not used afterwards."""
        if self._single is None:
            self._pool.close()
            return
        try:
            self._single.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._single.close()

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
    def _tx(self) -> Iterator[Db]:
        st = self._local
        if st.db is not None:
            st.depth += 1
            try:
                yield st.db
            finally:
                st.depth -= 1
            return
        try:
            with self._connection() as conn:
                db = Db(conn, self.postgres)
                self._begin(db)
                st.db, st.depth = db, 1
                try:
                    yield db
                    st.db, st.depth = None, 0
                    conn.execute("COMMIT")
                except BaseException:
                    st.db, st.depth = None, 0
                    self._rollback(conn)
                    raise
        except BaseException as e:
            st.after.clear()
            self._refuse(e)
        after, st.after = st.after, []
        for fn in after:
            fn()

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        """A connection of its own for this thread's transaction (SQLite: the one)."""
        if self._single is not None:
            yield self._single
        else:
            with self._pool.connection() as conn:
                yield conn

    def _begin(self, db: Db) -> None:
        if not self.postgres:
            db.conn.execute("BEGIN IMMEDIATE")
            return
        db.conn.execute("BEGIN")
        if self.epoch is not None:
            try:
                self._check_epoch(db)
            except BaseException:
                self._rollback(db.conn)
                raise

    def _rollback(self, conn: Any) -> None:
        try:
            if self.postgres or conn.in_transaction:
                conn.execute("ROLLBACK")
        except Exception:  # the connection is gone: nothing was committed
            log.debug("store %s: rollback failed", self, exc_info=True)

    def _refuse(self, e: BaseException) -> NoReturn:
        """Raise ``e``, or the retryable error for a full disk or a database lost (counted)."""
        refused = refusal(e, str(self))
        if refused is None:
            raise e
        self.on_error(refused.kind)
        raise refused from e

    def _check_epoch(self, db: Db) -> None:
        limit = "0" if self.idle_limit is None else f"{max(1, round(self.idle_limit * 1000))}ms"
        row = db.run(
            "SELECT epoch, set_config('idle_in_transaction_session_timeout', ?, true) "
            "FROM perseus_epoch WHERE id = 1 FOR SHARE",
            (limit,),
        ).fetchone()
        if row is None or int(row[0]) != self.epoch:
            raise NotLeader(
                f"this server is no longer the leader (its epoch {self.epoch}, the database's "
                f"{None if row is None else int(row[0])}); nothing was written"
            )

    # --- reads -----------------------------------------------------------------------------------

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """Every row of a query: on this thread's transaction if one is open, else on any."""
        db = self._local.db
        if db is not None:
            return list(db.run(sql, args).fetchall())
        if self._single is not None:
            return self._single.execute(sql, args).fetchall()
        with self._pool.connection() as conn:
            return list(conn.execute(_pyformat(sql), args).fetchall())

    def _row(self, sql: str, args: Sequence[Any] = ()) -> Any:
        rows = self._rows(sql, args)
        return rows[0] if rows else None


def _sqlite(path: Path) -> sqlite3.Connection:
    """The store's one SQLite connection (autocommit: the store begins its transactions)."""
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _pool(url: str, pool_size: int, timeout: float) -> Any:
    """A pool of PostgreSQL connections, the schema migrated (see :meth:`SqlConnection.open`)."""
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
            prepare(conn, url, postgres=True)
    except BaseException as e:
        pool.close()
        if isinstance(e, psycopg.Error) or getattr(e, "orig", None) is not None:
            raise StoreError(f"cannot use the database {describe(url)}: {e}") from e
        raise
    return pool
