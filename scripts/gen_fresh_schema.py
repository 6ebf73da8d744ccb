"""Regenerate the store's head schema (``fresh_sql.py``) from the migration history itself.

Usage::

    python scripts/gen_fresh_schema.py            # write the committed fresh_sql.py
    python scripts/gen_fresh_schema.py --out DIR  # write fresh_sql.py into DIR

A store opening an empty database writes the head's schema directly
(``server/perseus_server/runtime/schema/fresh.py``) instead of running the history with Alembic.
What it writes is generated here, never written by hand: the history (``alembic upgrade head``,
:func:`perseus_server.runtime.schema.migrate`) runs on a temporary SQLite file and on a temporary
PostgreSQL server (:class:`perseus_server.testing.postgres.PostgresServer`, Debian's
``postgresql``), and what it left is read back:

- SQLite: every object's DDL from ``sqlite_master`` in creation order, ``user_version``, and the
  rows the history seeds;
- PostgreSQL: ``pg_dump --schema-only`` (dependency order), cleaned of its session settings and
  schema names, and the rows the history seeds.

A seeded value that is the time of the migration (between the clock read before and after it) is
written as the database's ``now`` expression, so a new database gets its own creation time as
the history would give it. The stamp (``alembic_version``'s row) is left to ``fresh.py``.
``tests/server/runtime/schema/test_fresh_sql.py`` checks that the committed module matches a
fresh generation: a new revision without a regeneration fails there, naming this command.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["MODULE", "generate", "main", "postgres_schema", "render", "sqlite_schema"]

ROOT = Path(__file__).resolve().parent.parent
#: The generated module, committed beside the code that reads it.
MODULE = ROOT / "server" / "perseus_server" / "runtime" / "schema" / "fresh_sql.py"
COMMAND = "python scripts/gen_fresh_schema.py"
#: The schema the PostgreSQL history runs in here; its name is taken out of the dump.
_PG_SCHEMA = "perseus_head"
#: The table Alembic stamps; its DDL is generated, its row written by fresh.py.
_STAMP = "alembic_version"


def _migrate(target: str | Path, location: Path | None) -> tuple[float, float]:
    """Run the history (at ``location``, else the package's) on the empty database ``target``.

    Returns the clock before and after it.
    """
    from perseus_server.runtime import schema
    from perseus_server.runtime.stores import engine_for

    engine = engine_for(target, pool_size=1)
    try:
        before = time.time()
        schema.migrate(engine, *([location] if location else []))
        return before, time.time()
    finally:
        engine.dispose()


def _revision(rows: list[tuple[Any, ...]]) -> str:
    (row,) = rows
    return str(row[0])


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite_name(db: sqlite3.Connection, table: str, column: str | None = None) -> str:
    """``table`` (or its ``column``) bare where SQLite reads it so, else quoted."""
    name = table if column is None else column
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        probe = (
            f"SELECT 1 FROM {table}" if column is None else f"SELECT {column} FROM {_quote(table)}"
        )
        try:
            db.execute(probe + " LIMIT 0")
            return name
        except sqlite3.Error:
            pass
    return _quote(name)


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sqlite_value(value: Any, window: tuple[float, float]) -> str:
    """A seeded SQLite value as SQL; the migration's own time as SQLite's ``now``."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return "X'" + value.hex() + "'"
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return _text(value)
    if window[0] - 1 <= number <= window[1] + 1:
        if float(number).is_integer():
            return "strftime('%s', 'now')"  # what the history writes: whole seconds
        return "((julianday('now') - 2440587.5) * 86400.0)"
    return _text(value) if isinstance(value, str) else repr(value)


def sqlite_schema(path: Path, location: Path | None = None) -> tuple[str, list[str]]:
    """Run the history on a new SQLite file at ``path``; its revision and the statements."""
    window = _migrate(path, location)
    db = sqlite3.connect(path)
    try:
        objects = db.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
        ).fetchall()
        statements = [sql for _, _, sql in objects]
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version:
            statements.append(f"PRAGMA user_version = {version}")
        for kind, name, _ in objects:
            if kind != "table" or name == _STAMP:
                continue
            cur = db.execute(f"SELECT * FROM {_quote(name)}")
            columns = ", ".join(_sqlite_name(db, name, d[0]) for d in cur.description)
            into = _sqlite_name(db, name)
            for row in cur.fetchall():
                values = ", ".join(_sqlite_value(v, window) for v in row)
                statements.append(f"INSERT INTO {into} ({columns}) VALUES ({values})")
        revision = _revision(db.execute(f"SELECT version_num FROM {_STAMP}").fetchall())
    finally:
        db.close()
    return revision, statements


_DROPPED = ("SET ", "SELECT pg_catalog.set_config(", "CREATE SCHEMA ", "COMMENT ON SCHEMA ")


def _dump_statements(dump: str) -> list[str]:
    """``pg_dump``'s output as statements: no comments, session settings or schema names."""
    if "$$" in dump or "$_" in dump:
        raise SystemExit("the schema has a function body: extend scripts/gen_fresh_schema.py")
    lines = [ln for ln in dump.splitlines() if not ln.startswith(("--", "\\"))]
    statements, current = [], []
    for line in lines:
        if not current and not line.strip():
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            statements.append("\n".join(current).rstrip().removesuffix(";"))
            current = []
    if current:
        raise SystemExit(f"pg_dump's output ends mid-statement: {current}")
    kept = [s for s in statements if not s.startswith(_DROPPED)]
    cleaned = [s.replace(f"{_PG_SCHEMA}.", "") for s in kept]
    if any(_PG_SCHEMA in s for s in cleaned):
        raise SystemExit(f"the schema's name {_PG_SCHEMA!r} is left in pg_dump's output")
    return cleaned


_NUMBERS = {"smallint", "integer", "bigint", "real", "double precision", "numeric"}
_TIMES = ("timestamp", "date")


def _postgres_value(
    value: str | None, kind: str, epoch: float | None, window: tuple[float, float]
) -> str:
    """A seeded PostgreSQL value (its text) as SQL; the migration's own time as ``now()``."""
    if value is None:
        return "NULL"
    if epoch is not None and window[0] - 1 <= epoch <= window[1] + 1:
        if kind.startswith(_TIMES):
            return "now()" if kind == "timestamp with time zone" else f"now()::{kind}"
        return "extract(epoch FROM now())" + ("" if kind == "numeric" else f"::{kind}")
    if kind in _NUMBERS and re.fullmatch(r"-?[0-9.e+-]+", value):
        return value
    if kind == "text":
        return _text(value)
    return f"{_text(value)}::{kind}"


def _pg_name(conn: Any, name: str) -> str:
    """``name`` as PostgreSQL needs it written (quoted only where it must be)."""
    return str(conn.execute("SELECT quote_ident(%s)", (name,)).fetchone()[0])


def _seeded_rows(conn: Any, window: tuple[float, float]) -> list[str]:
    """An ``INSERT`` per row the history left in a table (the stamp's aside)."""
    tables = conn.execute(
        "SELECT c.oid, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p') "
        "ORDER BY c.relname",
        (_PG_SCHEMA,),
    ).fetchall()
    statements = []
    for oid, table in tables:
        if table == _STAMP:
            continue
        columns = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attidentity, attgenerated "
            "FROM pg_catalog.pg_attribute WHERE attrelid = %s AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (oid,),
        ).fetchall()
        reads = []
        for name, kind, _, _ in columns:
            epoch = "NULL"
            if kind in _NUMBERS:
                epoch = f"{_quote(name)}::double precision"
            elif kind.startswith(_TIMES):
                epoch = f"extract(epoch FROM {_quote(name)})::double precision"
            reads.append(f"{_quote(name)}::text, {epoch}")
        rows = conn.execute(f"SELECT {', '.join(reads)} FROM {_quote(table)}").fetchall()
        if rows and any(identity or generated for _, _, identity, generated in columns):
            raise SystemExit(f"{table}: seeded rows with an identity or generated column")
        names = ", ".join(_pg_name(conn, c[0]) for c in columns)
        into = _pg_name(conn, table)
        for row in rows:
            values = ", ".join(
                _postgres_value(row[2 * i], c[1], row[2 * i + 1], window)
                for i, c in enumerate(columns)
            )
            statements.append(f"INSERT INTO {into} ({names}) VALUES ({values})")
    return statements


@contextmanager
def _server(given: Any) -> Iterator[Any]:
    if given is not None:
        yield given
        return
    from perseus_server.testing.postgres import PostgresServer

    with PostgresServer() as server:
        yield server


def postgres_schema(server: Any = None, location: Path | None = None) -> tuple[str, int, list[str]]:
    """Run the history on a new PostgreSQL database; its revision, major version, statements.

    ``server``: a running :class:`~perseus_server.testing.postgres.PostgresServer` to use (one
    is started and stopped otherwise).
    """
    import psycopg

    with _server(server) as pg:
        url = pg.create_database(f"gen_{uuid.uuid4().hex[:12]}")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {_PG_SCHEMA}")
            conn.execute(f"ALTER DATABASE {conn.info.dbname} SET search_path = {_PG_SCHEMA}")
        window = _migrate(url, location)
        dump = subprocess.run(
            [
                str((pg.bin / "initdb").resolve().parent / "pg_dump"),
                "--schema-only",
                "--no-owner",
                "--no-privileges",
            ]
            + ["-n", _PG_SCHEMA, "-d", url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        with psycopg.connect(url, autocommit=True) as conn:
            major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000
            rows = _seeded_rows(conn, window)
            revision = _revision(conn.execute(f"SELECT version_num FROM {_STAMP}").fetchall())
    return revision, major, _dump_statements(dump) + rows


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _literal(statement: str) -> str:
    """A statement as a Python string literal, as ``ruff format`` leaves it.

    Triple-quoted where it spans lines plainly; else quoted with the quote that needs fewer
    escapes (double on a tie), as the formatter prefers.
    """
    plain = not re.search(r'[\\\t\r]|"""|"$|[ ]\n', statement)
    if "\n" in statement and plain:
        return '"""' + statement + '"""'
    quote = "'" if statement.count('"') > statement.count("'") else '"'
    body = "".join(_ESCAPES.get(ch, ch) for ch in statement).replace(quote, "\\" + quote)
    if not body.isprintable():
        return repr(statement)
    return quote + body + quote


def _block(name: str, doc: str, statements: list[str]) -> str:
    items = "".join(f"    {_literal(s)},\n" for s in statements)
    return f"#: {doc}\n{name}: tuple[str, ...] = (\n{items})\n"


def render(revision: str, major: int, sqlite: list[str], postgres: list[str]) -> str:
    """The generated module's text."""
    head = f'''"""The store's schema at revision {revision}, as statements (generated: do not edit).

Generated by ``{COMMAND}`` from what ``alembic upgrade head`` leaves on an empty
SQLite file and an empty PostgreSQL {major} database; :mod:`perseus_server.runtime.schema.fresh`
runs these on a new database, then stamps ``alembic_version``. A new revision is followed by
running that command again (``tests/server/runtime/schema/test_fresh_sql.py`` fails until then).
"""

#: The revision these statements are the schema of.
REVISION = "{revision}"

#: The PostgreSQL major version whose ``pg_dump`` wrote :data:`POSTGRES`.
POSTGRES_MAJOR = {major}

'''
    return (
        head
        + _block("SQLITE", "SQLite: ``sqlite_master`` in creation order, then the rows.", sqlite)
        + "\n"
        + _block("POSTGRES", "PostgreSQL: ``pg_dump``'s order, then the rows.", postgres)
    )


def generate(out_dir: Path, postgres: Any = None, location: Path | None = None) -> Path:
    """Write ``fresh_sql.py`` into ``out_dir`` from the history; returns its path.

    ``postgres``: a running PostgreSQL server to use (one is started otherwise); ``location``:
    the history (the package's own by default; tests add revisions to a copy).
    """
    with tempfile.TemporaryDirectory() as tmp:
        revision, sqlite = sqlite_schema(Path(tmp) / "head.db", location)
    pg_revision, major, pg = postgres_schema(postgres, location)
    if pg_revision != revision:
        raise SystemExit(f"the histories end apart: SQLite {revision}, PostgreSQL {pg_revision}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / MODULE.name
    path.write_text(render(revision, major, sqlite, pg))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=MODULE.parent, help="output directory")
    args = parser.parse_args(argv)
    print(generate(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
