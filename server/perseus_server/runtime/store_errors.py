"""What the store does when its disk cannot take a write, or its database cannot be reached.

The request is refused with a clear, retryable error instead of a 500, said once per failure in the
log and counted, and nothing of it is kept (its transaction is rolled back). Nothing else changes:
once space returns, the next write succeeds (the store needs no restart).

REST answers :class:`~perseus_server.domain.errors.StoreUnavailable` with 503, ``Retry-After``
and a problem body (``kind: disk_full``); gRPC with ``UNAVAILABLE``, which the rank clients
retry with backoff; ``perseus_store_errors_total{kind="disk_full"}`` counts them.

A PostgreSQL database lost (restarted, the network cut, the connection terminated, no
connection to be had from the pool, a transaction ended for idling past the leader's lease) is
refused the same way as ``database_unreachable``: nothing of it was committed, so nothing
acknowledged is lost.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from perseus_server.domain.errors import StoreUnavailable

__all__ = [
    "DISK_FULL_RETRY_SECONDS",
    "UNREACHABLE_RETRY_SECONDS",
    "ObservesErrors",
    "disk_full",
    "refusal",
]

log = logging.getLogger("perseus.server")

#: What ``Retry-After`` says when the disk is full (s): an operator frees space in minutes,
#: a client retrying every few seconds costs nothing.
DISK_FULL_RETRY_SECONDS = 5

#: What ``Retry-After`` says when the database cannot be reached (s): a failover takes a lease.
UNREACHABLE_RETRY_SECONDS = 5

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@runtime_checkable
class ObservesErrors(Protocol):
    """A store that reports each write it refuses (``on_error(kind)``: the service counts)."""

    on_error: Callable[[str], None]


def disk_full(e: BaseException, where: str) -> StoreUnavailable | None:
    """The retryable error for ``e`` when it says the disk (or the database) is full.

    None for any other error (which stays what it is).
    """
    if isinstance(e, sqlite3.Error):
        full = getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    else:
        full = isinstance(e, OSError) and e.errno in _FULL_ERRNOS
    if not full:
        return None
    log.error(
        "store %s: the disk is full (%s); the write was refused with 503 / UNAVAILABLE and "
        "nothing of it kept; free space and clients' retries succeed",
        where,
        e,
    )
    return StoreUnavailable(
        f"the server's disk is full ({where}); nothing of this request was stored: retry in "
        f"{DISK_FULL_RETRY_SECONDS} s (the operator has been told)",
        kind="disk_full",
        retry_after=DISK_FULL_RETRY_SECONDS,
    )


def refusal(e: BaseException, where: str) -> StoreUnavailable | None:
    """The retryable error for a write that failed with ``e``, or None (``e`` stays what it is).

    ``e`` as the driver (sqlite3, psycopg) or the pool raised it.
    """
    full = disk_full(e, where)
    if full is not None or _sqlite_only(e):
        return full
    import psycopg
    from psycopg_pool import PoolTimeout

    ended = psycopg.errors.IdleInTransactionSessionTimeout  # hung past the idle limit
    if not isinstance(e, psycopg.OperationalError | PoolTimeout | ended):
        return None
    kind = "disk_full" if isinstance(e, psycopg.errors.DiskFull) else "database_unreachable"
    what = (
        "the database's disk is full" if kind == "disk_full" else "the database cannot be reached"
    )
    log.warning("store %s: %s (%s); the write was refused", where, what, e)
    return StoreUnavailable(
        f"{what}; nothing of this request was stored: retry in {UNREACHABLE_RETRY_SECONDS} s",
        kind=kind,
        retry_after=UNREACHABLE_RETRY_SECONDS,
    )


def _sqlite_only(e: BaseException) -> bool:
    """Whether ``e`` can only be SQLite's (or the disk's) own: no other kind to look for."""
    return isinstance(e, sqlite3.Error | OSError)
