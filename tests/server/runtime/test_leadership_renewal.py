"""A new leader renews its lease from the moment it takes it.

Loading the state (before the server serves and watches its leadership) may take longer than
the lease, and must not let a standby take over meanwhile. A leadership lost before the server
watches it stops the server as soon as it does.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from perseus_server.runtime.leadership import Leader, Lease
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.testing.postgres import PostgresServer

from ..postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def test_the_lease_is_renewed_before_the_server_watches_it(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    SqlStore.open(url).close()  # the schema
    a, b = Lease(url, ttl=0.6, holder="a"), Lease(url, ttl=5.0, holder="b")
    try:
        assert a.try_acquire() == 1
        leader = Leader(a)
        time.sleep(1.5)  # "loading the state": longer than the lease, not yet watched
        assert b.try_acquire() is None and leader.deposed is None

        async def serve() -> bool:
            stop = asyncio.Event()
            leader.watch(stop)
            await asyncio.sleep(1.0)
            return stop.is_set()

        assert asyncio.run(serve()) is False  # still the leader
        assert leader.keeper is not None
        leader.keeper.stop()  # it hangs: the lease runs out and b takes it
        time.sleep(0.7)
        assert b.try_acquire() == 2
        again = Leader(a)
        deadline = time.monotonic() + 5
        while again.deposed is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert again.deposed is not None and "taken over" in again.deposed

        async def watch_late() -> bool:
            stop = asyncio.Event()
            again.watch(stop)  # lost before it was watched: stops at once
            await asyncio.wait_for(stop.wait(), 5)
            return stop.is_set()

        assert asyncio.run(watch_late()) is True
        again.close()
    finally:
        a.close()
        b.close()
