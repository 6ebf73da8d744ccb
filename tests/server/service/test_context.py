"""What every part of the service shares (``service/context.py``).

The one explicit object each part is given: the same store, jobs, hub, solver and metrics
for every part of one service, and background work held until it ends.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from perseus_server.config import Limits
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.context import ServiceContext


@pytest.fixture
def service() -> Iterator[PerseusService]:
    store = SqlStore.open(":memory:")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def test_every_part_of_a_service_shares_one_context(service: PerseusService) -> None:
    ctx = service.ctx
    assert isinstance(ctx, ServiceContext)
    assert (ctx.store, ctx.jobs, ctx.hub, ctx.solver) == (
        service.store,
        service.jobs,
        service.hub,
        service.solver,
    )
    for part in (service.tenants, service.registration, service.profiles, service.views):
        assert part.ctx is ctx


def test_spawned_work_is_held_until_it_ends(service: PerseusService) -> None:
    ctx = service.ctx
    done: list[str] = []

    async def work(gate: asyncio.Event) -> None:
        await gate.wait()
        done.append("ran")

    async def main() -> None:
        gate = asyncio.Event()
        ctx.spawn(work(gate))
        gc.collect()  # only the context holds the task: it is not collected mid-way
        assert len(ctx._background) == 1
        gate.set()
        for _ in range(3):
            await asyncio.sleep(0)
        assert done == ["ran"] and not ctx._background

    asyncio.run(main())
    with pytest.raises(RuntimeError):  # no running loop: nothing to run it on
        coro = work(asyncio.Event())
        try:
            ctx.spawn(coro)
        finally:
            coro.close()
