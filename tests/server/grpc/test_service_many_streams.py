"""A real server takes a whole job's ranks calling at once: 2,048 registrations, then 2,048 streams.

The server's event loop takes gRPC calls up one at a time; the rest wait in gRPC core's queue.
With core's default bound on that queue (1,000 calls), it refused calls past it at random, and
each refused one ended ``CANCELLED`` at its client (about one stream in ten of 2,048 opened at
once), with nothing in the server's log. Here 2,048 ranks of one job register at once and then
open their ``WatchPlan`` streams at once, from one process over four connections (512 streams
each, within the 1,024 a connection may carry): every call is answered, every stream receives
the current plan and none ends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import solved_job

pytestmark = pytest.mark.slow

STAGES, PIPELINES, CONNECTIONS = 2, 1024, 4


async def _all_at_once(target: str, job_id: str) -> tuple[list[int], dict[int, str]]:
    """Every rank registered at once, then every stream opened at once.

    Returns each stream's first plan version (0: none) and, by rank, how each stream that ended
    ended.
    """
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel
    channels = [grpc.aio.insecure_channel(target, options=own) for _ in range(CONNECTIONS)]
    stubs = [pb_grpc.PlanServiceStub(c) for c in channels]
    ranks = [(d, s) for d in range(PIPELINES) for s in range(STAGES)]
    registered: list[Any] = await asyncio.gather(
        *(
            stubs[i % CONNECTIONS].RegisterRank(
                pb.RegisterRankRequest(
                    job_id=job_id, global_rank=d * STAGES + s, pipeline_rank=s, data_rank=d
                ),
                timeout=120,
            )
            for i, (d, s) in enumerate(ranks)
        ),
        return_exceptions=True,
    )
    refused = [r for r in registered if isinstance(r, BaseException)]
    assert not refused, f"{len(refused)} of {len(ranks)} registrations failed, e.g. {refused[0]!r}"
    first = [0] * len(ranks)
    ended: dict[int, str] = {}
    got_all = asyncio.Event()

    async def watch(i: int) -> None:
        call = stubs[i % CONNECTIONS].WatchPlan(
            pb.WatchPlanRequest(job_id=job_id, rank_id=registered[i].rank_id)
        )
        try:
            async for msg in call:
                first[i] = first[i] or msg.version
                if all(first):
                    got_all.set()
        except grpc.aio.AioRpcError as e:
            ended[i] = f"{e.code().name}: {e.details()}"
            if len(ended) + sum(map(bool, first)) >= len(ranks):
                got_all.set()

    tasks = [asyncio.create_task(watch(i)) for i in range(len(ranks))]
    try:
        await asyncio.wait_for(got_all.wait(), timeout=120)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in channels:
            await c.close()
    return first, ended


def test_a_whole_job_registers_and_watches_at_once(
    server: ServerProcess, http: httpx.Client, small_csv: str
) -> None:
    job_id = solved_job(http, small_csv, data_parallel=PIPELINES)
    version = http.get(f"/jobs/{job_id}").json()["plan_version"]
    assert version >= 1
    first, ended = asyncio.run(_all_at_once(server.grpc_target, job_id))
    assert not ended, (
        f"{len(ended)} of {len(first)} streams ended, e.g. {next(iter(ended.items()))}"
    )
    assert first == [version] * (STAGES * PIPELINES)
