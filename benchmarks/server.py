"""Server benchmarks: plan-query throughput/latency and WatchPlan push fan-out.

    python benchmarks/server.py [--seconds 10] [--streams 256 1024] [--procs 4]

1. Starts ``perseus serve`` (temporary DB) and solves the A40 8-stage x 96-microbatch 1F1B job
   (1,536 instructions per pipeline; 128 data-parallel pipelines = 1,024 ranks).
2. Plan queries: a load generator in another process sends ``GET /jobs/{id}/plan?slowdown=s``
   (s cycling over 50 values) with ``--concurrency`` requests in flight; prints requests/s and
   p50/p99 latency.
3. Push fan-out: ``--procs`` client processes open the WatchPlan streams (256, then 1,024 ranks);
   once every stream holds the current version, ``PUT /jobs/{id}/plan`` deploys a new plan; the
   time from just before the PUT until the last stream received the new version is reported
   (median and max over ``--rounds`` deployments).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
STAGES, MICROBATCHES, PIPELINES = 8, 96, 128


def _query_load(url: str, job_id: str, seconds: float, concurrency: int, out: Any) -> None:
    import httpx

    async def main() -> list[float]:
        lat: list[float] = []
        stop = time.perf_counter() + seconds
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:

            async def worker(k: int) -> None:
                i = k
                while time.perf_counter() < stop:
                    s = (i % 50) * 0.005
                    t0 = time.perf_counter()
                    r = await c.get(f"/jobs/{job_id}/plan", params={"slowdown": s})
                    lat.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
                    i += concurrency

            await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return lat

    t0 = time.perf_counter()
    lat = asyncio.run(main())
    out.send((lat, time.perf_counter() - t0))


def _watchers(target: str, job_id: str, ranks: list[tuple[int, int, int]], conn: Any) -> None:
    import grpc

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc

    async def main() -> None:
        channels = [grpc.aio.insecure_channel(target) for _ in range(4)]
        stubs = [pb_grpc.PlanServiceStub(c) for c in channels]
        ids = []
        for i, (g, p, d) in enumerate(ranks):
            r = await stubs[i % 4].RegisterRank(
                pb.RegisterRankRequest(job_id=job_id, global_rank=g, pipeline_rank=p, data_rank=d)
            )
            ids.append(r.rank_id)
        latest = [0] * len(ids)
        got: dict[int, list[float]] = {}
        ready = asyncio.Event()

        async def watch(i: int) -> None:
            call = stubs[i % 4].WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=ids[i]))
            async for msg in call:
                latest[i] = msg.version
                got.setdefault(msg.version, []).append(time.time())
                if all(latest):
                    ready.set()

        tasks = [asyncio.create_task(watch(i)) for i in range(len(ids))]
        await ready.wait()
        loop = asyncio.get_running_loop()
        conn.send(("ready", max(latest)))
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd[0] == "stop":
                break
            want = cmd[1]
            while len(got.get(want, [])) < len(ids):
                await asyncio.sleep(0.002)
            conn.send(("got", max(got[want])))
        for t in tasks:
            t.cancel()
        for c in channels:
            await c.close()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--streams", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    import httpx

    from perseus_server import ServerProcess

    ctx = mp.get_context("spawn")
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp) / "bench.db") as srv:
        http = httpx.Client(base_url=srv.http_url, timeout=600)
        job = http.post(
            "/jobs",
            json={
                "stages": STAGES,
                "microbatches": MICROBATCHES,
                "schedule": "1f1b",
                "data_parallel": PIPELINES,
                "blocking_power": 70.38,
                "gpu_model": "A40",
            },
        ).json()
        job_id = job["id"]
        http.put(
            f"/jobs/{job_id}/profile",
            content=PROFILE.read_text(),
            headers={"content-type": "text/csv"},
        ).raise_for_status()
        t0 = time.perf_counter()
        http.post(f"/jobs/{job_id}/frontier").raise_for_status()
        while (st := http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json())[
            "status"
        ] not in ("done", "failed"):
            time.sleep(0.5)
        if st["status"] != "done":
            print("solve failed:", st["error"])
            return 1
        rows.append(
            (
                "frontier solve (server, worker process)",
                f"{time.perf_counter() - t0:.1f} s, {st['num_points']} points, "
                f"{job['instructions']} instructions",
            )
        )

        parent, child = ctx.Pipe()
        p = ctx.Process(
            target=_query_load, args=(srv.http_url, job_id, args.seconds, args.concurrency, child)
        )
        p.start()
        lat, wall = parent.recv()
        p.join()
        lat_ms = sorted(x * 1000 for x in lat)
        rows.append(
            (
                f"GET /plan?slowdown (concurrency {args.concurrency})",
                f"{len(lat) / wall:.0f} req/s, p50 {lat_ms[len(lat_ms) // 2]:.2f} ms, "
                f"p99 {lat_ms[int(len(lat_ms) * 0.99)]:.2f} ms ({len(lat)} requests)",
            )
        )

        slowdowns = [0.0, 0.1]
        for n in args.streams:
            ranks = [(d * STAGES + s, s, d) for d in range(PIPELINES) for s in range(STAGES)][:n]
            per = [ranks[i :: args.procs] for i in range(args.procs)]
            pipes, procs = [], []
            for chunk in per:
                a, b = ctx.Pipe()
                pr = ctx.Process(target=_watchers, args=(srv.grpc_target, job_id, chunk, b))
                pr.start()
                pipes.append(a)
                procs.append(pr)
            version = max(c.recv()[1] for c in pipes)
            times = []
            for r in range(args.rounds):
                t_put = time.time()
                dep = http.put(
                    f"/jobs/{job_id}/plan", json={"slowdown": slowdowns[r % 2] + 0.001 * r}
                ).json()
                version = dep["version"]
                for c in pipes:
                    c.send(("wait", version))
                last = max(c.recv()[1] for c in pipes)
                times.append(last - t_put)
            for c in pipes:
                c.send(("stop",))
            for pr in procs:
                pr.join(30)
            rows.append(
                (
                    f"push fan-out to {n} WatchPlan streams ({args.procs} client processes)",
                    f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
                    f"over {args.rounds} deployments",
                )
            )
        http.close()
    width = max(len(a) for a, _ in rows)
    print(f"{'measurement'.ljust(width)}  result")
    for a, b in rows:
        print(f"{a.ljust(width)}  {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
