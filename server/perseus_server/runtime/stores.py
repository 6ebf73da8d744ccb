"""Which store ``--db`` names: PostgreSQL for a PostgreSQL URL, else the embedded SQLite.

A PostgreSQL URL (``postgresql://user@host:5432/db``, or ``postgres://``) opens a
:class:`~perseus_server.runtime.postgres_store.PostgresStore`; a file path or ``sqlite:///path``
(``sqlite:////abs/path``, ``sqlite:///:memory:``) the embedded
:class:`~perseus_server.runtime.sqlite_store.SqliteStore`, the default.

The only place that names the store classes besides the tests (``server.py`` and
``perseus db migrate`` call :func:`open_store`).
"""

from __future__ import annotations

from pathlib import Path

from perseus_server.domain.store import Store, StoreError

__all__ = ["describe", "is_postgres", "open_store", "sqlite_path"]

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
    if is_postgres(target):
        from perseus_server.runtime.postgres_store import PostgresStore

        return PostgresStore.open(str(target), pool_size=pool_size)
    from perseus_server.runtime.sqlite_store import SqliteStore

    return SqliteStore.open(sqlite_path(target))


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
