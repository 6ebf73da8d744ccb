"""``perseus db migrate SRC DST``: copy a whole store into an empty one.

SQLite into PostgreSQL or back (either end a path, ``sqlite:///PATH`` or ``postgresql://...``).

The source is opened as a store first (bringing it to this server's schema) and refused when it
holds a table this server does not know (a newer server's). Then every table is copied row by
row, as stored: creation times, profile revisions, credential digests and their rotation and
revocation times, iteration history in its order, report sequences. Stop the server first (the
source must not change while it is read); point the server at the destination afterwards.

The destination is taken whole or not at all:

- **One migration at a time.** A PostgreSQL destination is locked for the copy's transaction
  (an advisory lock, then its tables locked against writers); an existing SQLite file is locked
  (``flock``) before its schema is touched. A second migration into it is refused at once,
  naming the one under way; one started after the first finished finds the destination full.
- **Only an empty destination.** Whether it holds data is read inside the copy's transaction,
  under those locks: a destination that holds data is refused and left alone.
- **All or nothing.** The copy is one transaction on the destination; a SQLite file that did not
  exist is built under a hidden name beside it (``.NAME.migrating-*``) and linked into place
  only when complete (a link fails rather than replace a file that appeared meanwhile). An
  error, or the process killed half way, leaves the destination as it was: absent, or empty
  (at this server's schema). A killed run into a new SQLite file may leave its hidden partial
  file behind: remove it.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any

from perseus_server.domain.store import StoreError
from perseus_server.runtime.stores import describe, is_postgres, open_store, sqlite_path

__all__ = ["TABLES", "copy_database"]

#: Every table a store keeps, in copy order. Their columns are read off the two databases (those
#: both have), so a column a revision adds is copied without being named here.
TABLES: tuple[str, ...] = (
    "tenants",
    "jobs",
    "profiles",
    "frontiers",
    "deployments",
    "ranks",
    "iterations",
    "profiling",
    "report_sequences",
    "power_budget",
    "credentials",
    "rank_bindings",
    "job_lifecycle",
)

#: Columns the destination numbers itself (identity, and each rank's row numbers), not copied.
_NUMBERED = {"iterations": frozenset({"seq", "n"}), "report_sequences": frozenset({"seq"})}
#: Tables of a database that are not data to copy (the schema's version, the leadership).
_BOOKKEEPING = frozenset({"alembic_version", "perseus_schema", "perseus_lease", "perseus_epoch"})
#: Rows every new database holds (the default tenant): no data of its own, replaced by the copy.
_SEEDED = {"tenants": "id = 'default'"}
#: The tables whose rows are kept in insertion order (their ``seq``).
_HISTORY = frozenset({"iterations", "report_sequences"})
#: Rows inserted per statement batch.
_CHUNK = 2000
#: The PostgreSQL advisory lock a migration holds on its destination ("perseusdb" in ASCII).
MIGRATE_LOCK = 0x7065727365757364
#: How long a migration waits for a writer's locks on a destination's tables (PostgreSQL).
_LOCK_WAIT = "5s"


class _End:
    """Raw access to one end's tables (below the store protocol: rows as stored)."""

    def __init__(self, conn: Any, postgres: bool) -> None:
        self.conn = conn
        self.postgres = postgres

    def tables(self) -> set[str]:
        if self.postgres:
            rows = self.conn.execute(
                "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
            ).fetchall()
        else:
            rows = self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
        return {str(r[0]) for r in rows} - _BOOKKEEPING

    def count(self, table: str) -> int:
        """The table's rows, those every new database holds left out."""
        seeded = _SEEDED.get(table)
        where = f" WHERE NOT ({seeded})" if seeded else ""
        return int(self.conn.execute(f"SELECT COUNT(*) FROM {table}{where}").fetchone()[0])

    def columns(self, table: str) -> tuple[str, ...]:
        """The table's columns as this database has them, those the destination numbers aside."""
        cur = self.conn.execute(f"SELECT * FROM {table} LIMIT 0")
        skip = _NUMBERED.get(table, frozenset())
        names = tuple(str(d[0]) for d in cur.description if d[0] not in skip)
        cur.close()
        return names

    def booleans(self, table: str) -> frozenset[str]:
        """The table's boolean columns (PostgreSQL's ``boolean``; SQLite stores 0 / 1)."""
        if not self.postgres:
            return frozenset()
        rows = self.conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = %s AND data_type = 'boolean'",
            (table,),
        ).fetchall()
        return frozenset(str(r[0]) for r in rows)

    def rows(self, table: str, columns: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        """The table's rows in their stored order (insertion order for the history tables)."""
        order = "seq" if table in _HISTORY else columns[0]
        cur = self.conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}")
        while chunk := cur.fetchmany(_CHUNK):
            yield from chunk

    def insert(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        mark = "%s" if self.postgres else "?"
        sql = (
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join(mark for _ in columns)})"
        )
        if self.postgres:
            with self.conn.cursor() as cur:
                cur.executemany(sql, rows)
        else:
            self.conn.executemany(sql, rows)


@contextmanager
def _connect(target: str) -> Iterator[_End]:
    if is_postgres(target):
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            yield _End(conn, True)
    else:
        with closing(sqlite3.connect(sqlite_path(target), isolation_level=None)) as conn:
            yield _End(conn, False)


def copy_database(
    src: str, dst: str, *, say: Callable[[str], None] | None = None
) -> dict[str, int]:
    """Copy every table of ``src`` into the empty ``dst``; returns the rows copied per table.

    See the module docstring. Raises :class:`StoreError` naming what is wrong.
    """
    if src == dst:
        raise StoreError("the source and the destination are the same database")
    open_store(src, pool_size=1).close()  # at this server's schema version
    with _connect(src) as a:
        unknown = a.tables() - set(TABLES)
        if unknown:
            raise StoreError(
                f"{describe(src)} holds tables this server does not know "
                f"({', '.join(sorted(unknown))}); use the server that wrote it"
            )
        with _destination(dst) as target:
            open_store(target, pool_size=1).close()  # at this server's schema version
            with _connect(target) as b, _transaction(b):
                _lock(b, dst)
                full = [t for t in TABLES if b.count(t)]
                if full:
                    raise StoreError(
                        f"{describe(dst)} is not empty ({', '.join(full)} hold rows); give an "
                        "empty database as the destination"
                    )
                return _copy(a, b, say)


def _copy(a: _End, b: _End, say: Callable[[str], None] | None) -> dict[str, int]:
    """Every table of ``a`` into ``b`` (in ``b``'s open transaction); rows per table."""
    copied: dict[str, int] = {}
    for table, seeded in _SEEDED.items():
        b.conn.execute(f"DELETE FROM {table} WHERE {seeded}")
    for table in TABLES:
        # Both ends are at this server's revision: the columns they share are the store's (a
        # SQLite file of the first release also keeps frontiers.ready_doc, which nothing reads).
        there = set(b.columns(table))
        columns = tuple(c for c in a.columns(table) if c in there)
        booleans = a.booleans(table) | b.booleans(table)
        flags = [c in booleans for c in columns]
        n = 0
        chunk: list[tuple[Any, ...]] = []
        for row in a.rows(table, columns):
            chunk.append(_convert(row, flags, b.postgres))
            if len(chunk) >= _CHUNK:
                b.insert(table, columns, chunk)
                n, chunk = n + len(chunk), []
        if chunk:
            b.insert(table, columns, chunk)
            n += len(chunk)
        copied[table] = n
        if say is not None:
            say(f"{table}: {n} rows")
    # Each rank's rows numbered in their order (the store trims by them).
    b.conn.execute(
        "UPDATE iterations SET n = x.k FROM (SELECT seq, row_number() OVER "
        "(PARTITION BY rank_id ORDER BY seq) AS k FROM iterations) x "
        "WHERE iterations.seq = x.seq"
    )
    return copied


def _under_way(dst: str) -> StoreError:
    return StoreError(
        f"another 'perseus db migrate' into {describe(dst)} is under way; nothing was written "
        "(run one migration at a time)"
    )


@contextmanager
def _destination(dst: str) -> Iterator[str]:
    """The destination to write, locked for this migration alone (see the module docstring).

    PostgreSQL: ``dst`` itself (its lock is taken in the copy's transaction, :func:`_lock`).
    An existing SQLite file: ``dst``, ``flock``-ed meanwhile. A SQLite file that does not
    exist: a hidden file beside it, linked into place once the copy committed.
    """
    if is_postgres(dst):
        yield dst
        return
    path = Path(sqlite_path(dst))
    if path.exists():
        with _flocked(path, dst):
            yield dst
        return
    partial = path.with_name(f".{path.name}.migrating-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        yield str(partial)
        _publish(partial, path, dst)
    finally:
        for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
            with suppress(FileNotFoundError):
                leftover.unlink()


@contextmanager
def _flocked(path: Path, dst: str) -> Iterator[None]:
    """An exclusive ``flock`` on the SQLite file at ``path`` (refused at once when held).

    SQLite's own locks are POSIX record locks, which ``flock`` does not touch; the descriptor
    is closed only after every connection of the copy (closing it drops no lock of theirs).
    """
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _under_way(dst) from None
        yield
    finally:
        os.close(fd)


def _publish(partial: Path, path: Path, dst: str) -> None:
    """Link the complete copy at ``partial`` into place at ``path`` (never replacing a file).

    Its write-ahead log is folded into the file first: the log is named after the partial
    file, and is removed with it.
    """
    with closing(sqlite3.connect(partial, isolation_level=None)) as db:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise StoreError(f"the copy for {describe(dst)} could not be completed (busy)")
        db.execute("PRAGMA journal_mode = DELETE")
        db.execute("PRAGMA journal_mode = WAL")
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    try:
        os.link(partial, path)
    except FileExistsError:
        raise StoreError(
            f"{describe(dst)} was created while the copy ran (another migration into it?); "
            "nothing was written to it"
        ) from None
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(end: _End, dst: str) -> None:
    """Hold the destination for this migration's transaction (PostgreSQL; see the docstring).

    SQLite's write lock is the transaction's own (``BEGIN IMMEDIATE``).
    """
    if not end.postgres:
        return
    import psycopg

    got = end.conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (MIGRATE_LOCK,)).fetchone()
    if not got[0]:
        raise _under_way(dst)
    end.conn.execute(f"SET LOCAL lock_timeout = '{_LOCK_WAIT}'")
    tables = ", ".join(TABLES)
    try:
        end.conn.execute(f"LOCK TABLE {tables} IN EXCLUSIVE MODE")
    except psycopg.errors.LockNotAvailable:
        raise StoreError(
            f"{describe(dst)} is being written (a server runs on it?); stop it first"
        ) from None


def _convert(row: tuple[Any, ...], flags: list[bool], postgres: bool) -> tuple[Any, ...]:
    """Booleans as the destination stores them (PostgreSQL ``boolean``, SQLite 0 / 1)."""
    if not any(flags):
        return row
    return tuple(
        (bool(v) if postgres else int(bool(v))) if flag and v is not None else v
        for v, flag in zip(row, flags, strict=True)
    )


@contextmanager
def _transaction(end: _End) -> Iterator[None]:
    if end.postgres:
        with end.conn.transaction():
            yield
        return
    try:
        end.conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as e:  # locked past the connection's wait
        raise StoreError(f"the destination is in use ({e}); stop what writes it first") from None
    try:
        yield
    except BaseException:
        end.conn.execute("ROLLBACK")
        raise
    end.conn.execute("COMMIT")
