"""The load of the failover benchmarks: simulated ranks using the real gRPC API.

:func:`ranks_proc` (run in a few processes) is a share of a job's ranks using the real gRPC API
against every server address at once, as ranks given ``PERSEUS_SERVER=a,b`` can: each rank
registers (with whichever server answers), holds a ``WatchPlan`` stream to every address
(waiting for an address that does not listen to listen, its channels reconnecting every 0.2-0.5
s; retrying a call that ends every 0.25-0.75 s), and reports one iteration every ``interval`` s (sequence-numbered; grouped in batches
sent to the address that last acknowledged one, the other on a failure or a 2 s timeout).
The parent asks it, over a pipe, when each rank first received a plan from an address after a
moment, and which reports were acknowledged.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

__all__ = ["ranks_proc"]

#: Channels per address per process (each holds up to this process's ranks / CHANNELS streams).
CHANNELS = 2
#: How long a report waits for its acknowledgement (a hung server must not stop the rank).
REPORT_TIMEOUT = 2.0
#: Reconnection backoff of the ranks' channels (gRPC's default grows to 120 s).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 500),
]


class _Ranks:
    """A process's ranks: what they received and what was acknowledged."""

    def __init__(self, n: int, slots: int) -> None:
        self.ids: list[str] = []
        #: Per rank, every plan received: (wall time, address index, version).
        self.plans: list[list[tuple[float, int, int]]] = [[] for _ in range(n)]
        self.version = [0] * n
        #: Acknowledged (rank id, iteration) not yet handed to the parent.
        self.acked: list[tuple[str, int]] = []
        self.counts = {"reports": 0, "failed_sends": 0, "partial_acks": 0, "plans": 0, "refused": 0}
        #: Why sends failed (status code and details), since the last drain.
        self.errors: dict[str, int] = {}
        self.stop = asyncio.Event()
        self.slots = slots

    def plans_since(self, t0: float, slot: int, min_version: int) -> dict[str, Any]:
        """Per rank, the first plan from ``slot`` at or after ``t0`` of ``min_version`` or more.

        Returns how many ranks have one, their delays, and how many got from it a version
        older than one they had before ``t0`` (a version gone back).
        """
        delays, back = [], 0
        for got in self.plans:
            before = max((v for t, _, v in got if t < t0), default=0)
            after = [(t, v) for t, s, v in got if t >= t0 and s == slot]
            back += any(v < before for _, v in after)
            first = next((t for t, v in after if v >= min_version), None)
            if first is not None:
                delays.append(first - t0)
        return {"ranks": len(self.plans), "have": len(delays), "delays": delays, "back": back}

    def drain(self) -> dict[str, Any]:
        out, self.acked = self.acked, []
        errors, self.errors = self.errors, {}
        return {"acked": out, "errors": errors, **self.counts}


def _stubs(targets: list[str]) -> tuple[list[Any], list[list[Any]]]:
    import grpc

    from perseus_common.proto import perseus_pb2_grpc as pb_grpc

    chans = [
        [grpc.aio.insecure_channel(t, options=CHANNEL_OPTIONS) for _ in range(CHANNELS)]
        for t in targets
    ]
    return [c for cs in chans for c in cs], [
        [pb_grpc.PlanServiceStub(c) for c in cs] for cs in chans
    ]


async def _register(
    st: _Ranks, stubs: list[list[Any]], job_id: str, ranks: list[tuple[int, int, int]]
) -> None:
    import grpc

    from perseus_common.proto import perseus_pb2 as pb

    async def one(i: int, g: int, p: int, d: int) -> str:
        req = pb.RegisterRankRequest(job_id=job_id, global_rank=g, pipeline_rank=p, data_rank=d)
        while True:
            for s in range(st.slots):
                try:
                    r = await stubs[s][i % CHANNELS].RegisterRank(req, timeout=10)
                    return str(r.rank_id)
                except grpc.aio.AioRpcError:
                    continue
            await asyncio.sleep(0.5)

    for k in range(0, len(ranks), 64):
        part = ranks[k : k + 64]
        st.ids += await asyncio.gather(*(one(k + j, *r) for j, r in enumerate(part)))


async def _watch(st: _Ranks, stubs: list[list[Any]], job_id: str, i: int, s: int) -> None:
    import grpc

    from perseus_common.proto import perseus_pb2 as pb

    req = pb.WatchPlanRequest(job_id=job_id, rank_id=st.ids[i])
    while not st.stop.is_set():
        try:
            # Waits for the address to listen (no retries against a closed port); a server
            # that answers (a standby saying so) ends the call, and it is retried.
            async for msg in stubs[s][i % CHANNELS].WatchPlan(req, wait_for_ready=True):
                st.plans[i].append((time.time(), s, int(msg.version)))
                st.version[i] = max(st.version[i], int(msg.version))
                st.counts["plans"] += 1
        except grpc.aio.AioRpcError:
            st.counts["refused"] += 1
        await asyncio.sleep(0.25 + random.random() * 0.5)


async def _report(
    st: _Ranks, stubs: list[list[Any]], job_id: str, mine: list[int], interval: float
) -> None:
    import grpc

    from perseus_common.proto import perseus_pb2 as pb

    incarnation = time.time_ns() // 1000 + random.randrange(10**6)
    it, cur = 0, 0
    await asyncio.sleep(random.random() * interval)
    while not st.stop.is_set():
        it += 1
        batch = [
            pb.IterationReport(
                job_id=job_id,
                rank_id=st.ids[i],
                iteration=it,
                iteration_time=1.0,
                plan_version=st.version[i],
                sequence=it,
                incarnation=incarnation,
            )  # fmt: skip
            for i in mine
        ]
        for attempt in range(st.slots):
            s = (cur + attempt) % st.slots
            try:
                ack = await stubs[s][mine[0] % CHANNELS].ReportIterations(
                    iter(batch), timeout=REPORT_TIMEOUT
                )
            except grpc.aio.AioRpcError as e:
                st.counts["failed_sends"] += 1
                why = f"{e.code().name}: {e.details()}"[:120]
                st.errors[why] = st.errors.get(why, 0) + 1
                continue
            cur = s
            if ack.accepted == len(batch):
                st.acked += [(st.ids[i], it) for i in mine]
                st.counts["reports"] += len(batch) - int(ack.duplicates)
            else:
                st.counts["partial_acks"] += 1
            break
        await asyncio.sleep(interval)


def ranks_proc(
    targets: list[str],
    job_id: str,
    ranks: list[tuple[int, int, int]],
    interval: float,
    conn: Any,
) -> None:
    """Process body: ``ranks`` of ``job_id`` against every one of ``targets``.

    ``ranks`` are (global, pipeline, data rank). Sends ``("registered", n)`` first, then
    answers the parent's requests on ``conn`` (see the module docstring):
    ``("plans_since", t0, slot, min_version)``, ``("drain",)`` and ``("stop",)``.
    """

    async def main() -> None:
        loop = asyncio.get_running_loop()
        st = _Ranks(len(ranks), len(targets))
        channels, stubs = _stubs(targets)
        await _register(st, stubs, job_id, ranks)
        conn.send(("registered", len(st.ids)))
        tasks = [
            asyncio.create_task(_watch(st, stubs, job_id, i, s))
            for i in range(len(st.ids))
            for s in range(len(targets))
        ]
        groups = max(1, len(st.ids) // 16)
        tasks += [
            asyncio.create_task(
                _report(st, stubs, job_id, list(range(k, len(st.ids), groups)), interval)
            )
            for k in range(groups)
        ]

        async def answer(cmd: tuple[Any, ...]) -> Any:
            if cmd[0] == "plans_since":
                return st.plans_since(*cmd[1:])
            if cmd[0] == "drain":
                return st.drain()
            st.stop.set()
            return st.drain()

        def serve() -> None:
            while True:
                cmd = conn.recv()
                conn.send(asyncio.run_coroutine_threadsafe(answer(cmd), loop).result())
                if cmd[0] == "stop":
                    return

        threading.Thread(target=serve, daemon=True).start()
        await st.stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in channels:
            await c.close()

    asyncio.run(main())
