"""``perseus db migrate SRC DST``: copy a whole store into an empty one.

SQLite into PostgreSQL or back (either end a path, ``sqlite:///PATH`` or ``postgresql://...``).

Both ends are first opened as stores (bringing each to this server's schema), then every table
is copied row by row, as stored: creation times, profile revisions, credential digests and
their rotation and revocation times, iteration history in its order, report sequences. The copy
is one transaction on the destination: an error leaves it as empty as it was. It refuses a
destination that holds data, and a source with a table it does not know (a newer server's),
rather than leave something behind. Stop the server first (the source must not change while
it is read); point the server at the destination afterwards.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any

from perseus_server.domain.store import StoreError
from perseus_server.runtime.stores import describe, is_postgres, open_store, sqlite_path

__all__ = ["TABLES", "copy_database"]

#: Every table a store keeps, in copy order: ``(name, columns, boolean columns)``.
TABLES: tuple[tuple[str, tuple[str, ...], frozenset[str]], ...] = (
    (
        "tenants",
        ("id", "created", "max_jobs", "max_gpus", "weight", "guaranteed_watts"),
        frozenset(),
    ),
    ("jobs", ("id", "created", "spec", "tenant"), frozenset()),
    ("profiles", ("job_id", "csv", "revision", "updated", "source"), frozenset()),
    (
        "frontiers",
        (
            "job_id",
            "status",
            "progress",
            "error",
            "doc",
            "profile_revision",
            "started",
            "finished",
            "solve_seconds",
            "partial",
        ),
        frozenset({"partial"}),
    ),
    ("deployments", ("job_id", "version", "doc", "updated"), frozenset()),
    ("ranks", ("job_id", "global_rank", "rank_id", "info", "registered"), frozenset()),
    (
        "iterations",
        ("rank_id", "job_id", "iteration", "time", "energy", "plan_version", "received"),
        frozenset(),
    ),
    ("profiling", ("job_id", "doc"), frozenset()),
    (
        "report_sequences",
        ("rank_id", "incarnation", "job_id", "last", "updated"),
        frozenset(),
    ),
    ("power_budget", ("id", "doc", "updated"), frozenset()),
    (
        "credentials",
        ("id", "scope", "job_id", "hash", "created", "rotated", "revoked", "tenant"),
        frozenset(),
    ),
    ("rank_bindings", ("rank_id", "job_id", "global_rank", "credential_id"), frozenset()),
    ("job_lifecycle", ("job_id", "state", "since", "reason"), frozenset()),
)

#: Tables of a database that are not data to copy (the schema's version, the leadership).
_BOOKKEEPING = frozenset({"perseus_schema", "perseus_lease", "perseus_epoch"})
#: Rows every new database holds (the default tenant): no data of its own, replaced by the copy.
_SEEDED = {"tenants": "id = 'default'"}
#: The tables whose rows are kept in insertion order (PostgreSQL's ``seq``, SQLite's ``rowid``).
_HISTORY = frozenset({"iterations", "report_sequences"})
#: Rows inserted per statement batch.
_CHUNK = 2000


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

    def rows(self, table: str, columns: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        """The table's rows in their stored order (insertion order for the history tables)."""
        order = ("seq" if table in _HISTORY else columns[0]) if self.postgres else "rowid"
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
    for target in (src, dst):
        open_store(target, pool_size=1).close()  # both at this server's schema version
    copied: dict[str, int] = {}
    with _connect(src) as a, _connect(dst) as b:
        unknown = a.tables() - {t for t, _, _ in TABLES}
        if unknown:
            raise StoreError(
                f"{describe(src)} holds tables this server does not know "
                f"({', '.join(sorted(unknown))}); use the server that wrote it"
            )
        full = [t for t, _, _ in TABLES if b.count(t)]
        if full:
            raise StoreError(
                f"{describe(dst)} is not empty ({', '.join(full)} hold rows); give an empty "
                "database as the destination"
            )
        with _transaction(b):
            for table, seeded in _SEEDED.items():
                b.conn.execute(f"DELETE FROM {table} WHERE {seeded}")
            for table, columns, booleans in TABLES:
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
            if b.postgres:  # each rank's rows numbered in their order (the store trims by them)
                b.conn.execute(
                    "UPDATE iterations SET n = x.k FROM (SELECT seq, row_number() OVER "
                    "(PARTITION BY rank_id ORDER BY seq) AS k FROM iterations) x "
                    "WHERE iterations.seq = x.seq"
                )
    return copied


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
    end.conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        end.conn.execute("ROLLBACK")
        raise
    end.conn.execute("COMMIT")
