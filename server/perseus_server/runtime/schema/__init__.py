"""The store's one migration history (Alembic), for SQLite and PostgreSQL alike.

The revisions live in ``versions/``; the database's ``alembic_version`` table says which it has
reached. :func:`migrate` (called when a store opens: ``perseus serve``, ``perseus db migrate``)
upgrades to the newest under the database's own lock, so servers starting on one database at
once migrate it once: SQLite's write lock (``BEGIN IMMEDIATE``), PostgreSQL's advisory lock
:data:`MIGRATION_LOCK`. Operators may run the same upgrade themselves, with the repository's
``alembic.ini``: ``alembic -x db=URL upgrade head`` (``URL`` as ``--db`` takes it; or
``PERSEUS_DB``).

The first revision is the schema both stores had when they moved to Alembic; it also brings a
database stamped by the stores' earlier version tables (SQLite's ``user_version`` 1 to 8,
PostgreSQL's ``perseus_schema`` 1 to 2) to it in place, keeping every row
(:mod:`~perseus_server.runtime.schema.legacy_sqlite`,
:mod:`~perseus_server.runtime.schema.legacy_postgres`). A change of what is stored is one new
revision (``alembic revision -m "..."``, written with Alembic's ``op``, which speaks both
dialects) and the statements that use it in :mod:`perseus_server.runtime.sql_store`, then
``python scripts/gen_fresh_schema.py`` (a new database's direct schema,
:mod:`~perseus_server.runtime.schema.fresh_sql`, generated from the history); a revision that
shipped is never edited.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus_server.domain.store import StoreError

if TYPE_CHECKING:
    import sqlalchemy as sa
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "MIGRATION_LOCK",
    "at_head",
    "config",
    "head",
    "locked",
    "migrate",
    "prepare",
    "revision",
]

#: The advisory lock key PostgreSQL migrations run under ("perseus" in ASCII, as a bigint).
MIGRATION_LOCK = 0x70657273657573

_HERE = Path(__file__).resolve().parent


def config(location: Path = _HERE) -> Config:
    """The Alembic configuration of the history at ``location`` (no ini file needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(location))
    return cfg


@cache
def _script(location: Path = _HERE) -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(config(location))


_REVISION = re.compile(r"^(down_)?revision\s*=\s*['\"]?([^'\"\n]*?)['\"]?\s*$", re.M)


@cache
def _newest() -> str:
    """The head of this package's history, read off its files (without loading Alembic)."""
    named: set[str] = set()
    below: set[str] = set()
    for path in (_HERE / "versions").glob("*.py"):
        for down, rev in _REVISION.findall(path.read_text()):
            (below if down else named).add(rev)
    (newest,) = named - below
    return newest


def at_head(conn: Any) -> bool:
    """Whether the database of ``conn`` (the driver's, in autocommit mode) is at the head.

    What every store opening asks first: one query, SQLAlchemy and Alembic left unloaded.
    """
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except Exception:  # no such table: a new database, or one of before Alembic
        return False
    return row is not None and row[0] == _newest()


def prepare(conn: Any, target: str | Path, postgres: bool) -> None:
    """Bring the database of ``conn`` (the driver's, in autocommit mode) to the head.

    What a store does as it opens: nothing when the database is at the head (:func:`at_head`);
    on a database holding no table yet, the head's schema written directly
    (:mod:`~perseus_server.runtime.schema.fresh`, Alembic and SQLAlchemy left unloaded); else
    the history, with Alembic (:func:`migrate`). ``target``: the database as ``--db`` names it.
    """
    if at_head(conn):
        return
    from perseus_server.runtime.schema import fresh

    if fresh.create(conn, postgres, _newest()):
        return
    from perseus_server.runtime.stores import engine_for

    migrate(engine_for(target, creator=lambda: conn))


def head(location: Path = _HERE) -> str:
    """The newest revision: the schema this code reads and writes."""
    got = _script(location).get_current_head()
    assert got is not None
    return got


def revision(conn: sa.Connection) -> str | None:
    """The revision the database has reached (None: not stamped by Alembic)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


@contextmanager
def locked(conn: sa.Connection) -> Iterator[sa.Connection]:
    """One transaction on ``conn`` (an autocommit connection) holding the migration lock."""
    postgres = conn.dialect.name == "postgresql"
    conn.exec_driver_sql("BEGIN" if postgres else "BEGIN IMMEDIATE")
    try:
        if postgres:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        yield conn
    except BaseException:
        conn.exec_driver_sql("ROLLBACK")
        raise
    conn.exec_driver_sql("COMMIT")


def migrate(engine: sa.Engine, location: Path = _HERE) -> str | None:
    """Upgrade the database of ``engine`` to the newest revision in one locked transaction.

    All of it or nothing: a revision that fails leaves the database as it was. Returns the
    revision it had (None: a new database, or one stamped by the earlier version tables).
    Raises :class:`StoreError` when the database was written by a newer server.
    ``location``: the history (tests add revisions to a copy).
    """
    from alembic import command

    newest = head(location)
    with engine.connect() as conn:
        found = revision(conn)
        if found == newest:
            return found  # the common case: nothing to do, no lock taken
        with locked(conn):
            found = revision(conn)
            _known(found, location)
            cfg = config(location)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    return found


def _known(found: str | None, location: Path) -> None:
    from alembic.util import CommandError

    if found is None:
        return
    try:
        _script(location).get_revision(found)
    except CommandError:
        raise StoreError(
            f"the database has schema revision {found!r}, newer than this server's "
            f"{head(location)!r}; use a newer server or another database"
        ) from None
