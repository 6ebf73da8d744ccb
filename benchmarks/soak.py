"""Soak: many ranks at once for a bounded time, then a SIGKILL and a restart.

    python benchmarks/soak.py [--seconds 600] [--ranks 1024] [--procs 4]
    python benchmarks/soak.py --smoke   # 8 s, 16 ranks (the suite's)
    python benchmarks/soak.py --failover [--failovers 20] [--ranks 1024] [--hang 30] [--lease 5]
    python benchmarks/soak.py --failover --smoke   # 2 failovers, 16 ranks (the suite's)

With ``--failover``: a leader and a standby on one PostgreSQL database under the ranks' load,
and ``--failovers`` faults of the leader in turn (SIGKILL, SIGSTOP for ``--hang`` s, its
database connection cut), each measured as ``failover.py`` does (the same rounds: that file's
docstring says what each column is); prints the table, the worst time per fault until every
rank has a plan from the new leader (the goal is 10 s), and the invariants over the whole run:
acknowledged reports lost, plan versions gone back, epochs in which two servers committed.
Exits 1 when an invariant or the goal does not hold.

1. Starts ``perseus serve`` (temporary DB) and solves a 2-stage x 8-microbatch job with
   ``ranks / 2`` data-parallel pipelines, so every rank identity is a real rank of it.
2. ``--procs`` load processes register their share of the ranks, hold a ``WatchPlan`` stream
   each and report iterations (one per rank every ``--interval`` s, with sequence numbers, each
   batch re-sent once in ten to exercise deduplication); the main process meanwhile queries
   plans, toggles stragglers, re-solves and deploys, and a probe polls ``/healthz``.
3. Every 5 s it samples the server's resident memory. At the end the server is SIGKILLed and
   restarted on the same database, and each rank's last acknowledged iteration is compared
   with what the restarted server has stored (``/status``): any rank whose stored iteration is
   older than its last acknowledged one lost an acknowledged report.

Prints memory over time, /healthz p50/p99, requests served, and the acknowledged-but-lost count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
STAGES, MICROBATCHES = 2, 8


def _ranks_proc(
    target: str,
    job_id: str,
    ranks: list[tuple[int, int, int]],
    interval: float,
    stop: Any,
    out: Any,
) -> None:
    """Register ``ranks``, watch their plans, report until ``stop``.

    Sends back the last acknowledged iteration per rank id and counts.
    """
    import grpc

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc

    async def main() -> dict[str, Any]:
        channels = [grpc.aio.insecure_channel(target) for _ in range(4)]
        stubs = [pb_grpc.PlanServiceStub(c) for c in channels]
        ids: list[str] = []
        for i, (g, p, d) in enumerate(ranks):
            r = await stubs[i % 4].RegisterRank(
                pb.RegisterRankRequest(job_id=job_id, global_rank=g, pipeline_rank=p, data_rank=d)
            )
            ids.append(r.rank_id)
        versions = [0] * len(ids)
        acked: dict[str, int] = {}
        counts = {"reports": 0, "duplicates": 0, "errors": 0, "plans": 0}

        async def watch(i: int) -> None:
            while not stop.is_set():
                try:
                    call = stubs[i % 4].WatchPlan(
                        pb.WatchPlanRequest(job_id=job_id, rank_id=ids[i])
                    )
                    async for msg in call:
                        versions[i] = msg.version
                        counts["plans"] += 1
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.5)

        async def report(k: int) -> None:
            it = 0
            seq = time.time_ns() // 1000
            mine = list(range(k, len(ids), 16))
            while not stop.is_set():
                batch = []
                for i in mine:
                    seq += 1
                    batch.append(
                        pb.IterationReport(
                            job_id=job_id,
                            rank_id=ids[i],
                            iteration=it,
                            iteration_time=1.0 + random.random() * 0.01,
                            plan_version=versions[i],
                            sequence=seq,
                        )  # fmt: skip
                    )
                for _attempt in range(2 if random.random() < 0.1 else 1):
                    try:
                        ack = await stubs[k % 4].ReportIterations(iter(batch), timeout=60)
                        counts["reports"] += ack.accepted - ack.duplicates
                        counts["duplicates"] += ack.duplicates
                        for i in mine:
                            acked[ids[i]] = it
                    except grpc.aio.AioRpcError:
                        counts["errors"] += 1
                it += 1
                await asyncio.sleep(interval)

        tasks = [asyncio.create_task(watch(i)) for i in range(len(ids))]
        tasks += [asyncio.create_task(report(k)) for k in range(16)]
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in channels:
            await c.close()
        return {"acked": acked, **counts}

    out.send(asyncio.run(main()))


def _probe(url: str, stop: Any, out: Any) -> None:
    import httpx

    lat: list[float] = []
    errors = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                errors += c.get("/healthz").status_code != 200
            except httpx.HTTPError:
                errors += 1
            lat.append(time.perf_counter() - t0)
            time.sleep(0.05)
    out.send((lat, errors))


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _failover(argv: list[str]) -> int:
    """``--failover``: the failovers in turn (see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import failover

    ap = failover.parser(__doc__ or "")
    ap.add_argument("--failover", action="store_true", help="failovers instead of the load soak")
    ap.add_argument("--failovers", type=int, default=20, help="faults, rotating")
    ap.add_argument("--smoke", action="store_true", help="2 failovers, 16 ranks, a 2 s lease")
    args = ap.parse_args(argv)
    if args.smoke:
        args.failovers, args.ranks, args.procs, args.lease = 2, 16, 1, 2.0
        args.hang, args.cut, args.settle, args.interval = 3.0, 3.0, 1.0, 0.5
    t0 = time.monotonic()
    faults = [failover.FAULTS[i % len(failover.FAULTS)] for i in range(args.failovers)]
    res = failover.run(args, faults)
    res["seconds"] = time.monotonic() - t0
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"soak --failover: {len(res['rounds'])} failovers in {res['seconds']:.0f} s")
    return 0 if failover.report(res) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--failover" in argv:
        return _failover(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--interval", type=float, default=1.0, help="s between a rank's reports")
    ap.add_argument("--smoke", action="store_true", help="8 s, 16 ranks in 1 process")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seconds, args.ranks, args.procs, args.interval = 8.0, 16, 1, 0.2

    import httpx

    from perseus_server import ServerProcess

    ctx = mp.get_context("spawn")
    pipelines = max(1, args.ranks // STAGES)
    lines = PROFILE.read_text().splitlines()
    profile = "\n".join([lines[0]] + [x for x in lines[1:] if int(x.split(",")[0]) < STAGES])
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp) / "soak.db")
        srv.start()
        http = httpx.Client(base_url=srv.http_url, timeout=120)
        spec = {"stages": STAGES, "microbatches": MICROBATCHES, "data_parallel": pipelines}
        job_id = http.post("/jobs", json={**spec, "blocking_power": 70.38}).json()["id"]
        http.put(f"/jobs/{job_id}/profile", content=profile).raise_for_status()
        http.post(f"/jobs/{job_id}/frontier").raise_for_status()
        while http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json()[
            "status"
        ] not in ("done", "failed"):
            time.sleep(0.2)
        ranks = [(d * STAGES + s, s, d) for d in range(pipelines) for s in range(STAGES)]
        stop = ctx.Event()
        pipes, procs = [], []
        for k in range(args.procs):
            a, b = ctx.Pipe()
            p = ctx.Process(
                target=_ranks_proc,
                args=(srv.grpc_target, job_id, ranks[k :: args.procs], args.interval, stop, b),
                daemon=True,
            )
            p.start()
            pipes.append(a)
            procs.append(p)
        pa, pb_ = ctx.Pipe()
        probe = ctx.Process(target=_probe, args=(srv.http_url, stop, pb_), daemon=True)
        probe.start()
        memory: list[tuple[float, float]] = []
        served = {"plan queries": 0, "straggler toggles": 0, "re-solves": 0, "deploys": 0}
        t0 = time.perf_counter()
        next_sample = 0.0
        try:
            while (now := time.perf_counter() - t0) < args.seconds:
                if now >= next_sample:
                    memory.append((now, _rss_mib(srv.pid)))
                    next_sample += 5.0
                http.get(f"/jobs/{job_id}/plan", params={"slowdown": random.random() * 0.2})
                served["plan queries"] += 1
                roll = random.random()
                if roll < 0.05:
                    pipe = random.randrange(pipelines)
                    http.post(
                        f"/jobs/{job_id}/stragglers", json={"pipeline": pipe, "slowdown": 0.1}
                    )
                    http.delete(f"/jobs/{job_id}/stragglers", params={"pipeline": pipe})
                    served["straggler toggles"] += 1
                elif roll < 0.07:
                    if http.post(f"/jobs/{job_id}/frontier").status_code == 202:
                        served["re-solves"] += 1
                elif (
                    roll < 0.12
                    and http.put(f"/jobs/{job_id}/plan", json={"slowdown": roll}).status_code == 200
                ):
                    served["deploys"] += 1
                time.sleep(0.02)
        finally:
            stop.set()
        results = [a.recv() for a in pipes]
        lat, errors = pa.recv()
        for p in procs:
            p.join(30)
        memory.append((time.perf_counter() - t0, _rss_mib(srv.pid)))
        srv.kill()
        srv.start()
        with httpx.Client(base_url=srv.http_url, timeout=120) as after:
            status = after.get(f"/jobs/{job_id}/status", params={"ranks": 1024}).json()
        srv.stop()
        http.close()

    acked: dict[str, int] = {}
    for r in results:
        acked.update(r["acked"])
    stored = {r["rank_id"]: r["last_iteration"] for r in status["ranks"]}
    lost = [
        rid
        for rid, it in acked.items()
        if (stored.get(rid) if stored.get(rid) is not None else -1) < it
    ]
    ms = sorted(x * 1000 for x in lat)
    print(f"soak: {args.seconds:g} s, {len(ranks)} ranks in {args.procs} processes")
    print("server memory (RSS, MiB) over time:")
    for t, m in memory:
        print(f"  {t:6.0f} s  {m:7.1f}")
    if ms:
        print(
            f"/healthz: p50 {ms[len(ms) // 2]:.1f} ms, p99 {ms[int(len(ms) * 0.99)]:.1f} ms over "
            f"{len(ms)} probes, {errors} failed"
        )
    else:  # a run shorter than the probe process's start
        print(f"/healthz: 0 probes, {errors} failed")
    print(
        "served: "
        + ", ".join(f"{v} {k}" for k, v in served.items())
        + f", {sum(r['reports'] for r in results)} reports "
        f"({sum(r['duplicates'] for r in results)} re-sent and dropped, "
        f"{sum(r['errors'] for r in results)} failed sends), "
        f"{sum(r['plans'] for r in results)} plan pushes"
    )
    print(f"acknowledged but lost after SIGKILL + restart: {len(lost)} of {len(acked)} ranks")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
