"""Active/standby: which of the servers sharing one PostgreSQL database is the leader.

A **lease** row (``perseus_lease``: holder, expiry by the database's clock) names the leader;
it renews the lease every ``ttl / 3`` seconds. Another server takes the lease once it has
expired (the leader died, hung, or lost the database for ``ttl`` seconds), and in the same
transaction raises the **epoch** (``perseus_epoch``). The store checks the epoch in every write
transaction (:meth:`~perseus_server.runtime.sql_connection.SqlConnection.fence`, a ``FOR SHARE``
read of the epoch row): raising it waits for the transactions of the old epoch to end, and
afterwards every write of a deposed leader (one that was stopped for longer than its lease and
resumes, say) is refused with :class:`NotLeader`. So no two leaders commit in one epoch, and the
new leader, which loads the state after raising the epoch, sees every commit acknowledged before.

``perseus serve --db postgresql://...`` listens at once, and takes the lease before it loads the
state and serves; a standby waits, printing who leads, and answers on its ports that it is a
standby, naming the leader's advertised addresses (stored with the lease;
:mod:`perseus_server.standby`). A leader stops, exit status 3, when it can no longer renew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from perseus_server.domain.errors import StoreUnavailable
from perseus_server.domain.store import StoreError

__all__ = [
    "DEPOSED_EXIT",
    "Lease",
    "LeaseKeeper",
    "Leader",
    "NotLeader",
    "StoppedWaiting",
    "become_leader",
]

log = logging.getLogger("perseus.leadership")

#: The exit status of a server that lost its leadership.
DEPOSED_EXIT = 3


#: Seconds a client refused by a server that no longer leads is asked to wait.
NOT_LEADER_RETRY_SECONDS = 2


class NotLeader(StoreUnavailable, StoreError):
    """A write of a server whose leadership epoch is no longer the database's.

    Nothing was written; the client is answered 503 / ``UNAVAILABLE`` (retry, at the leader),
    never a 500.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail, kind="not_leader", retry_after=NOT_LEADER_RETRY_SECONDS)


class Lease:
    """One server's view of the lease (its own connection to the database)."""

    def __init__(
        self, url: str, ttl: float = 5.0, holder: str | None = None, advertise: str = ""
    ) -> None:
        if not ttl > 0:
            raise ValueError("the lease must last a positive number of seconds")
        self.url = url
        self.ttl = ttl
        #: Where the leader can be reached, stored with the lease it takes (opaque text here:
        #: :func:`perseus_server.standby.advertised` writes it, the standby reads it).
        self.advertise = advertise
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.epoch: int | None = None
        #: This machine's monotonic clock just before the query that took or last renewed the
        #: lease (None: not held). The database's expiry is later than ``since + ttl``.
        self.since: float | None = None
        self._conn: Any = None

    def holds(self) -> bool:
        """Whether the lease surely still holds by this machine's clock.

        Taken or renewed less than ``ttl`` seconds ago, counted from before the query that did
        it: a process stopped past its lease (or whose renewals fail) sees it has lapsed the
        moment it runs again, before anything it would answer.
        """
        since = self.since
        return since is not None and time.monotonic() - since < self.ttl

    def _db(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        return self._conn

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(connection)``; a broken connection is dropped (the next call reconnects)."""
        import psycopg

        try:
            return fn(self._db())
        except psycopg.OperationalError:
            self.close()
            raise

    def try_acquire(self) -> int | None:
        """Take the lease if it is free or expired (or ours) and raise the epoch.

        Returns the new epoch, or None while another server holds it.
        """

        def take(conn: Any) -> int | None:
            with conn.transaction():
                holder, live = conn.execute(
                    "SELECT holder, expires > now() FROM perseus_lease WHERE id = 1 FOR UPDATE"
                ).fetchone()
                if live and holder != self.holder:
                    return None
                conn.execute(
                    "UPDATE perseus_lease SET holder = %s, expires = now() + make_interval("
                    "secs => %s), advertise = %s WHERE id = 1",
                    (self.holder, self.ttl, self.advertise),
                )
                # Waits for the writes of the old epoch (they hold the row FOR SHARE).
                return int(
                    conn.execute(
                        "UPDATE perseus_epoch SET epoch = epoch + 1, holder = %s, since = now() "
                        "WHERE id = 1 RETURNING epoch",
                        (self.holder,),
                    ).fetchone()[0]
                )

        started = time.monotonic()
        epoch = self._call(take)
        if epoch is not None:
            self.epoch, self.since = epoch, started
        return epoch

    def renew(self) -> bool:
        """Extend the lease; False when it is no longer ours.

        It is no longer ours when it expired and was taken, or the epoch moved on.
        """
        started = time.monotonic()
        row = self._call(
            lambda conn: conn.execute(
                "UPDATE perseus_lease SET expires = now() + make_interval(secs => %s) "
                "WHERE id = 1 AND holder = %s AND expires > now() "
                "AND (SELECT epoch FROM perseus_epoch WHERE id = 1) = %s RETURNING 1",
                (self.ttl, self.holder, self.epoch),
            ).fetchone()
        )
        if row is None:
            self.since = None
            return False
        self.since = started
        return True

    def leader(self) -> tuple[str, int, bool]:
        """``(holder, epoch, live)`` of the lease.

        Who holds the lease, the current epoch, and whether the lease is still running.
        """
        holder, live, epoch = self._call(
            lambda conn: conn.execute(
                "SELECT l.holder, l.expires > now(), e.epoch FROM perseus_lease l, perseus_epoch e"
            ).fetchone()
        )
        return str(holder), int(epoch), bool(live)

    def leader_info(self) -> tuple[str, int, bool, str]:
        """Who leads, with where it said it can be reached.

        Returns:
            ``(holder, epoch, live, advertise)``: :meth:`leader`'s answer and the text the
            holder stored with its lease.
        """
        holder, live, epoch, advertise = self._call(
            lambda conn: conn.execute(
                "SELECT l.holder, l.expires > now(), e.epoch, l.advertise "
                "FROM perseus_lease l, perseus_epoch e"
            ).fetchone()
        )
        return str(holder), int(epoch), bool(live), str(advertise)

    def release(self) -> None:
        """Give the lease up at once; best effort.

        A clean stop: the standby need not wait for it to expire.
        """
        import psycopg

        try:
            self._call(
                lambda conn: conn.execute(
                    "UPDATE perseus_lease SET expires = '-infinity' WHERE id = 1 AND holder = %s",
                    (self.holder,),
                )
            )
        except psycopg.Error as e:
            log.warning("could not release the leader lease: %s", e)

    def close(self) -> None:
        """Close the lease's database connection."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class LeaseKeeper:
    """Renews a held lease on a thread of its own every ``ttl / 3`` s.

    Calls ``lost(why)`` once (from that thread) when the lease is no longer ours or could not be
    renewed for ``ttl`` seconds (by this machine's clock, counted from before the last renewal
    that succeeded).
    """

    def __init__(self, lease: Lease, lost: Callable[[str], None]) -> None:
        self.lease = lease
        self.lost = lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perseus-lease", daemon=True)

    def start(self) -> LeaseKeeper:
        """Start renewing on the keeper's thread; returns ``self``."""
        self._thread.start()
        return self

    def _run(self) -> None:
        import psycopg

        lease = self.lease
        while not self._stop.wait(lease.ttl / 3):
            try:
                if not lease.renew():
                    self.lost(f"the lease was taken over (epoch {lease.epoch} ended)")
                    return
            except psycopg.Error as e:
                if not lease.holds():
                    self.lost(f"the lease could not be renewed for {lease.ttl:g} s: {e}")
                    return
                log.warning("renewing the leader lease failed (retrying): %s", e)

    def stop(self) -> None:
        """Stop renewing (waits up to 10 s for the thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


class StoppedWaiting(Exception):
    """SIGTERM or SIGINT arrived while the server waited as a standby."""


class Leader:
    """This server's leadership: the lease, kept renewed, and what to do when it is lost.

    The lease is renewed from the moment it was taken: loading the state may take longer
    than the lease.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.deposed: str | None = None
        self._lock = threading.Lock()
        self._tell: Callable[[str], None] | None = None
        self.keeper: LeaseKeeper | None = LeaseKeeper(lease, self._heard).start()

    def holds(self) -> bool:
        """Whether this server may answer as the leader now: not deposed, its lease holding.

        See :meth:`Lease.holds`; the standby's answers (:mod:`perseus_server.standby`) refuse
        every call while it is False.
        """
        return self.deposed is None and self.lease.holds()

    def _heard(self, why: str) -> None:
        with self._lock:
            self.deposed = why
            tell = self._tell
        if tell is not None:
            tell(why)

    def watch(self, stop: asyncio.Event) -> None:
        """When the lease is lost (or was already), log it and set ``stop`` (on the loop)."""
        loop = asyncio.get_running_loop()

        def lost(why: str) -> None:
            log.error("lost the leadership (%s); stopping", why)
            stop.set()

        def tell(why: str) -> None:
            loop.call_soon_threadsafe(lost, why)

        with self._lock:
            self._tell = tell
            deposed = self.deposed
        if deposed is not None:
            lost(deposed)

    def close(self) -> None:
        """Stop renewing; give the lease up unless it was lost (a standby takes over at once)."""
        if self.keeper is not None:
            self.keeper.stop()
        if self.deposed is None:
            self.lease.release()
        self.lease.close()


async def become_leader(
    store: Any,
    ttl: float,
    say: Callable[[str], None],
    *,
    advertise: str = "",
    heard: Callable[[str, int, bool, str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> Leader | None:
    """Take the leadership of ``store``'s database and fence the store with its epoch.

    Waits as a standby while another server leads; None for a store without leadership
    (SQLite). ``advertise``: where this server can be reached, stored with the lease it takes.
    ``heard(holder, epoch, live, advertise)``: told who leads each time the standby looks
    (every ``ttl / 5`` s). Raises :class:`StoppedWaiting` when ``stop`` is set meanwhile
    (without one: when SIGTERM or SIGINT arrive).
    """
    if not getattr(store, "postgres", False):
        return None
    import psycopg

    lease = Lease(store.url, ttl, advertise=advertise)
    loop = asyncio.get_running_loop()
    signals = () if stop is not None else (signal.SIGTERM, signal.SIGINT)
    stop = stop or asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    told: tuple[str, int] | None = None
    try:
        while not stop.is_set():
            try:
                epoch = await asyncio.to_thread(lease.try_acquire)
                if epoch is not None:
                    store.fence(epoch, idle_limit=ttl)  # a hung leader cannot hold it
                    say(f"perseus: leader (epoch {epoch}, {lease.holder})")
                    return Leader(lease)
                holder, current, live, where = await asyncio.to_thread(lease.leader_info)
                if heard is not None:
                    heard(holder, current, live, where)
                if told != (holder, current):
                    say(f"perseus: standby (the leader is {holder}, epoch {current})")
                    told = (holder, current)
            except psycopg.Error as e:
                log.warning("cannot reach the database for the leadership (retrying): %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ttl / 5)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
    lease.close()
    raise StoppedWaiting
