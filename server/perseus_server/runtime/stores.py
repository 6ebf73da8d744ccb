"""Which database ``--db`` names: PostgreSQL for a PostgreSQL URL, else the embedded SQLite.

A PostgreSQL URL (``postgresql://user@host:5432/db``, or ``postgres://``) or a file path or
``sqlite:///path`` (``sqlite:////abs/path``, ``sqlite:///:memory:``, the default kind): one
:class:`~perseus_server.runtime.sql_store.SqlStore` serves both, on the SQLAlchemy engine
:func:`engine_for` makes (PostgreSQL through psycopg 3).

``server.py`` and ``perseus db migrate`` call :func:`open_store`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perseus_server.domain.store import Store, StoreError

if TYPE_CHECKING:
    import sqlalchemy as sa

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


def engine_for(
    target: str | Path,
    *,
    pool_size: int = 4,
    timeout: float = 10.0,
    creator: Callable[[], Any] | None = None,
) -> sa.Engine:
    """A SQLAlchemy engine on the database ``target`` names (migrations, maintenance, tests).

    Its connections are in autocommit mode: whoever uses it begins its transactions
    (:func:`perseus_server.runtime.schema.locked`). ``creator``: the one driver connection to
    use (the store migrates on its own); otherwise PostgreSQL gets a pool of up to
    ``pool_size`` connections, waited for ``timeout`` seconds at most, and SQLite one connection.
    """
    import sqlalchemy as sa
    from sqlalchemy.pool import StaticPool

    if is_postgres(target):
        rest = str(target).split("://", 1)[1]
        if creator is not None:
            return sa.create_engine(
                "postgresql+psycopg://", creator=creator, poolclass=StaticPool,
                isolation_level="AUTOCOMMIT",
            )  # fmt: skip
        return sa.create_engine(
            f"postgresql+psycopg://{rest}",
            pool_size=max(1, pool_size),
            max_overflow=0,
            pool_timeout=timeout,
            isolation_level="AUTOCOMMIT",
            connect_args={"connect_timeout": max(1, round(timeout))},
        )
    path = sqlite_path(target)
    if creator is None:
        import sqlite3

        def creator() -> Any:
            return sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)

    return sa.create_engine(
        "sqlite://", creator=creator, poolclass=StaticPool, isolation_level="AUTOCOMMIT"
    )


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
