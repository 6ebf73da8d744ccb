"""Which database ``--db`` names: PostgreSQL for a PostgreSQL URL, else the embedded SQLite.

A PostgreSQL URL (``postgresql://user@host:5432/db``, or ``postgres://``) or a file path or
``sqlite:///path`` (``sqlite:////abs/path``, ``sqlite:///:memory:``, the default kind): one
:class:`~perseus_server.runtime.sql_store.SqlStore` serves both, on the SQLAlchemy engine
:func:`engine_for` makes (PostgreSQL through psycopg 3).

``server.py`` and ``perseus db migrate`` call :func:`open_store`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import StaticPool

from perseus_server.domain.store import Store, StoreError

__all__ = ["describe", "engine_for", "is_postgres", "open_store", "sqlite_path"]

_SQLITE = "sqlite:///"


def is_postgres(target: str | Path) -> bool:
    """Whether ``target`` names a PostgreSQL database."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def sqlite_path(target: str | Path) -> Path:
    """The SQLite file ``target`` names (a path, or a ``sqlite:///`` URL).

    Raises :class:`StoreError` for a URL of another kind.
    """
    if isinstance(target, Path):
        return target
    if target.startswith(_SQLITE):
        return Path(target[len(_SQLITE) :])
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise StoreError(
            f"--db {scheme}://...: unknown kind of database {scheme!r}; give a file path, "
            "sqlite:///PATH or postgresql://USER@HOST/DB"
        )
    return Path(target)


def open_store(target: str | Path, *, pool_size: int = 4) -> Store:
    """Open (and migrate) the store ``target`` names (see the module docstring)."""
    from perseus_server.runtime.sql_store import SqlStore

    return SqlStore.open(target, pool_size=pool_size)


def engine_for(target: str | Path, *, pool_size: int = 4, timeout: float = 10.0) -> sa.Engine:
    """The engine of the database ``target`` names, its connections in autocommit mode.

    The store begins and ends its transactions itself (``BEGIN IMMEDIATE`` on SQLite, which
    takes the write lock at once). PostgreSQL: a pool of up to ``pool_size`` connections, a
    connection waited for ``timeout`` seconds at most. SQLite: one connection (WAL mode,
    ``synchronous=NORMAL``), the parent folder created.
    """
    if is_postgres(target):
        scheme, rest = str(target).split("://", 1)
        return sa.create_engine(
            f"postgresql+psycopg://{rest}",
            pool_size=max(1, pool_size),
            max_overflow=0,
            pool_timeout=timeout,
            isolation_level="AUTOCOMMIT",
            connect_args={"connect_timeout": max(1, round(timeout))},
        )
    path = sqlite_path(target)
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        "sqlite://",
        creator=lambda: _sqlite_connect(path),
        poolclass=StaticPool,
        isolation_level="AUTOCOMMIT",
    )
    return engine


def _sqlite_connect(path: Path) -> Any:
    import sqlite3

    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def describe(target: str | Path) -> str:
    """``target`` as the server's log may show it (a URL's password hidden)."""
    if not is_postgres(target):
        return str(target)
    head, _, tail = str(target).partition("://")
    creds, at, rest = tail.rpartition("@")
    if not at:
        return str(target)
    user = creds.split(":", 1)[0]
    return f"{head}://{user}{':***' if ':' in creds else ''}@{rest}"
