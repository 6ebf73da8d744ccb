"""Server benchmarks: plan-query throughput/latency and WatchPlan push fan-out.

    python benchmarks/server.py [--seconds 10] [--streams 4096 10000] [--procs 4]
        [--baseline TREE] [--query-rounds 2] [--client raw|httpx] [--smoke]

1. Starts ``perseus serve`` (temporary DB) and solves the A40 8-stage x 96-microbatch 1F1B job
   (1,536 instructions per pipeline), tensor parallel 2, with as many data-parallel pipelines
   as the largest ``--streams`` needs (10,240 ranks for 10,000 streams). Each of the 50
   queries below is sent once before measuring (the same warm-up for every server).
2. Plan queries: a load generator in another process sends ``GET /jobs/{id}/plan?slowdown=s``
   (s cycling over 50 values) with ``--concurrency`` requests in flight for ``--seconds``;
   prints requests/s and p50/p99 latency. ``--client raw`` (default) sends each request's
   bytes, built once, over keep-alive sockets and reads the answer by its length, so the
   figures are the server's; ``--client httpx`` costs the load generator about as much CPU
   as the server's answer (on two shared cores it then measures both).
3. Push fan-out: ``--procs`` client processes open the WatchPlan streams (each count of
   ``--streams``); once every stream holds the current version, ``PUT /jobs/{id}/plan``
   deploys a new plan; the time from just before the PUT until the last stream received the
   new version is reported (median and max over ``--rounds`` deployments). A registration
   that ends ``CANCELLED``, or a stream that does before its first plan, is tried again, as a
   rank's client does, and counted (the row says how many). From the server's
   ``perseus_push_latency_seconds`` histogram, each row also says within which of its buckets
   the server had written every stream's message (what is left is the client processes').

``--baseline TREE`` runs, beside this tree's server, the server of another source tree (a
``git worktree`` of an older commit, run with that tree's packages first on the path), both
solved and warmed alike; the query runs alternate between them (``--query-rounds`` each, in
the order A B B A ...) and each push count runs on both, every row with the load average:
the comparison side by side in one run. ``--smoke``: 8 microbatches, 1 s, 16 streams, one
deployment (a test runs it, against this tree as its own baseline).

``--healthz-under-load SECONDS`` measures instead how free the event loop stays: a probe
process polls ``/healthz`` every 10 ms (p50/p99/max) while, at once, profiles of the 16 MiB
upload limit are uploaded (a valid A40 profile and a malformed 15 MB JSON one in turn), reports of 100,000
instruction measurements stream in over gRPC, and frontier computations of a 4-stage x
32-microbatch job complete and deploy one after another. With ``--loop-trace`` the server runs
in asyncio debug mode (``PYTHONASYNCIODEBUG=1``), which logs every event-loop callback that
runs over 100 ms; the benchmark then lists them by callback (count, total and longest), which
says what holds the loop during the slow probes (debug mode itself slows the server a little:
compare the latencies of a run without it). ``--loads`` runs only some of the three loads
(``uploads``, ``reports``, ``solves``): one at a time, it says which one costs the probes.

``--status-load SECONDS`` measures what one job's status costs at the largest registration the
server allows: ``--ranks`` (4,096) ranks of an 8-stage job register over gRPC, each with the
most supported clocks and the longest GPU and host names a registration may carry, and report
one iteration each; then ``GET /jobs/{id}/status`` (the default document) is timed one request
at a time (p50/p99, bytes), every rank's detail is read page by page (``?ranks=1024&after=``),
and a probe polls ``/healthz`` every 10 ms while two clients poll the status back to back
(p50/p99/max). ``--smoke`` runs it small (64 ranks, 1 s): a test runs that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
#: The job: 8 stages x 96 microbatches, ``TENSOR``-way tensor parallel, as many data-parallel
#: pipelines as the largest ``--streams`` needs (10,240 ranks for 10,000 streams).
STAGES, MICROBATCHES, TENSOR = 8, 96, 2


def _query_path(job_id: str, k: int) -> str:
    """The ``k``-th query of the load: ``slowdown`` cycling over 50 values (0 to 0.245)."""
    return f"/jobs/{job_id}/plan?slowdown={(k % 50) * 0.005}"


def _query_load(
    url: str, job_id: str, seconds: float, concurrency: int, out: Any, client: str = "raw"
) -> None:
    """``concurrency`` requests in flight for ``seconds``; sends ``(latencies, wall)``.

    ``client="raw"``: one keep-alive socket per worker, the request's bytes built once, the
    answer read by its ``Content-Length`` (a few tens of microseconds a request, so the figures
    are the server's); ``"httpx"``: an ``httpx.AsyncClient``, which costs the load generator
    about as much CPU as the server's answer.
    """

    async def raw() -> list[float]:
        host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
        reqs = [
            f"GET {_query_path(job_id, k)} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
            for k in range(50)
        ]
        lat: list[float] = []
        stop = time.perf_counter() + seconds

        async def worker(k: int) -> None:
            reader, writer = await asyncio.open_connection(host, int(port))
            i = k
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                writer.write(reqs[i % 50])
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                lat.append(time.perf_counter() - t0)
                assert head.startswith(b"HTTP/1.1 200 "), head
                i += concurrency
            writer.close()

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return lat

    async def with_httpx() -> list[float]:
        import httpx

        lat: list[float] = []
        stop = time.perf_counter() + seconds
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:

            async def worker(k: int) -> None:
                i = k
                while time.perf_counter() < stop:
                    t0 = time.perf_counter()
                    r = await c.get(_query_path(job_id, i))
                    lat.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
                    i += concurrency

            await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return lat

    t0 = time.perf_counter()
    lat = asyncio.run(raw() if client == "raw" else with_httpx())
    out.send((lat, time.perf_counter() - t0))


#: Times a benchmark registration that ends ``CANCELLED``, or a stream that does before its
#: first plan, is tried again.
REOPENS = 20


def retry_wait(attempt: int) -> float:
    """Seconds before try ``attempt + 1``: 0.05 s doubling up to 1 s, each at random 0.5-1x.

    As a rank's client backs off (it from 0.1 s up to 5 s), so that retries spread out.
    """
    return min(1.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0)


def _watchers(target: str, job_id: str, ranks: list[tuple[int, int, int, int]], conn: Any) -> None:
    """Register ``ranks`` and hold a ``WatchPlan`` stream for each (a client process of the push).

    A registration that ends ``CANCELLED``, or a stream that does before its first plan, is
    tried again (as a rank's client does), at most :data:`REOPENS` times, and counted: the count
    goes to ``conn`` with ``"ready"``. Any other end, or a stream's end after a plan, ends the
    process with the status said.
    """
    import grpc

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc

    async def main() -> None:
        # A connection of its own per channel (a process shares one by default), each carrying
        # at most 256 streams: the server allows 1,024 at once on one connection.
        k = max(4, -(-len(ranks) // 256))
        own = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.aio.insecure_channel(target, options=own) for _ in range(k)]
        stubs = [pb_grpc.PlanServiceStub(c) for c in channels]
        retried = 0

        async def register(i: int) -> str:
            nonlocal retried
            g, p, d, t = ranks[i]
            req = pb.RegisterRankRequest(
                job_id=job_id, global_rank=g, pipeline_rank=p, data_rank=d, tensor_rank=t
            )
            for attempt in range(REOPENS + 1):
                try:
                    return str((await stubs[i % k].RegisterRank(req)).rank_id)
                except grpc.aio.AioRpcError as e:
                    if e.code() is not grpc.StatusCode.CANCELLED or attempt == REOPENS:
                        raise
                    retried += 1  # as a rank's client does: again, after a short wait
                    await asyncio.sleep(retry_wait(attempt))
            raise AssertionError("unreachable")

        ids = [await register(i) for i in range(len(ranks))]
        latest = [0] * len(ids)
        got: dict[int, list[float]] = {}
        ready = asyncio.Event()

        async def watch(i: int) -> None:
            nonlocal retried
            for attempt in range(REOPENS + 1):
                call = stubs[i % k].WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=ids[i]))
                try:
                    async for msg in call:
                        latest[i] = msg.version
                        got.setdefault(msg.version, []).append(time.time())
                        if all(latest):
                            ready.set()
                    return
                except grpc.aio.AioRpcError as e:  # said, rather than waited for forever
                    if stopping:
                        return
                    if (
                        not latest[i]
                        and e.code() is grpc.StatusCode.CANCELLED
                        and attempt < REOPENS
                    ):
                        retried += 1  # as a rank's client does: again, after a short wait
                        await asyncio.sleep(retry_wait(attempt))
                        continue
                    had = sum(map(bool, latest))
                    print(
                        f"WatchPlan of rank {ranks[i]}: {e.code().name} {e.details()} "
                        f"({had} of this process's {len(latest)} streams had a plan)"
                    )
                    sys.stdout.flush()
                    os._exit(1)

        stopping = False
        tasks = [asyncio.create_task(watch(i)) for i in range(len(ids))]
        await ready.wait()
        loop = asyncio.get_running_loop()
        conn.send(("ready", retried))
        while True:
            cmd = await loop.run_in_executor(None, conn.recv)
            if cmd[0] == "stop":
                break
            want = cmd[1]
            while len(got.get(want, [])) < len(ids):
                await asyncio.sleep(0.002)
            conn.send(("got", max(got[want])))
        stopping = True
        for t in tasks:
            t.cancel()
        for c in channels:
            await c.close()

    asyncio.run(main())


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of latencies ``xs`` (s), in ms (the sample at ``int(n * q)``)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] * 1000


def latency(xs: list[float]) -> str:
    """``p50 .. ms, p99 .. ms, max .. ms`` of latencies ``xs`` (s)."""
    return f"p50 {pct(xs, 0.5):.1f} ms, p99 {pct(xs, 0.99):.1f} ms, max {max(xs) * 1000:.1f} ms"


def probe_healthz(url: str, stop: Any, out: Any, go: Any = None) -> None:
    """``GET /healthz`` every 10 ms until ``stop``; sends ``(latencies, failures)`` to ``out``.

    With ``go`` (an event), it first sends ``"ready"`` once connected and waits for ``go``.
    """
    import httpx

    lat: list[float] = []
    errors = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        if go is not None:
            out.send("ready")
            go.wait()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = c.get("/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            lat.append(time.perf_counter() - t0)
            errors += not ok
            time.sleep(0.01)
    out.send((lat, errors))


def wait_frontier(http: Any, job_id: str, every: float = 0.2) -> dict[str, Any]:
    """Poll the job's frontier computation until it is done or failed; its status."""
    while (st := http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json())[
        "status"
    ] not in ("done", "failed"):
        time.sleep(every)
    return dict(st)


def start_job(
    http: Any, microbatches: int, data_parallel: int, tensor_parallel: int = 1
) -> dict[str, Any]:
    """An A40 8-stage 1F1B job with the profile in ``profiles/``, its frontier computation started.

    Its size is ``microbatches`` x ``data_parallel`` x ``tensor_parallel``.
    """
    job = http.post(
        "/jobs",
        json={
            "stages": STAGES, "microbatches": microbatches, "schedule": "1f1b",
            "data_parallel": data_parallel, "tensor_parallel": tensor_parallel,
            "blocking_power": 70.38, "gpu_model": "A40",
        },
    ).json()  # fmt: skip
    http.put(
        f"/jobs/{job['id']}/profile",
        content=PROFILE.read_text(),
        headers={"content-type": "text/csv"},
    ).raise_for_status()
    http.post(f"/jobs/{job['id']}/frontier").raise_for_status()
    return dict(job)


def solved_job(
    http: Any, microbatches: int, data_parallel: int, tensor_parallel: int = 1
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """:func:`start_job`, then its frontier computed.

    Returns the job, the frontier's status and the seconds the computation took.
    """
    t0 = time.perf_counter()
    job = start_job(http, microbatches, data_parallel, tensor_parallel)
    st = wait_frontier(http, job["id"], 0.2)
    return job, st, time.perf_counter() - t0


def print_rows(rows: list[tuple[str, str]], head: str = "measurement") -> None:
    """The rows as a two-column table."""
    width = max(len(a) for a, _ in rows + [(head, "")])
    print(f"{head.ljust(width)}  result")
    for a, b in rows:
        print(f"{a.ljust(width)}  {b}")


def _reporter(target: str, job_id: str, stop: Any, out: Any) -> None:
    import grpc

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc

    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.PlanServiceStub(ch)
        rank = stub.RegisterRank(
            pb.RegisterRankRequest(job_id=job_id, global_rank=0, pipeline_rank=0)
        ).rank_id
        ops = [
            pb.InstructionMeasurement(
                instruction="forward", microbatch=i % 32, frequency_mhz=1740, time=0.01, stage=0
            )
            for i in range(100_000)
        ]
        sent = 0
        while not stop.is_set():
            rep = pb.IterationReport(
                job_id=job_id, rank_id=rank, iteration=sent, iteration_time=1.0,
                plan_version=1, instructions=ops, sequence=sent + 1,
            )  # fmt: skip
            stub.ReportIterations(iter([rep]), timeout=120)
            sent += 1
    out.send(sent)


_SLOW = re.compile(r"Executing (<.*?>) took (\d+\.\d+) seconds")
_CORO = re.compile(r"coro=<([\w.]+)\(")


def slow_callbacks(log: str, top: int = 8) -> list[tuple[str, str]]:
    """Asyncio debug mode's slow-callback lines of a server log, grouped, the longest total first.

    Grouped by the task's coroutine (or the handle, its addresses blanked).
    """
    groups: dict[str, list[float]] = {}
    for m in _SLOW.finditer(log):
        coro = _CORO.search(m.group(1))
        name = coro.group(1) if coro else re.sub(r" at 0x[0-9a-f]+", "", m.group(1))[:120]
        groups.setdefault(name, []).append(float(m.group(2)))
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [
        (
            f"  slow callback {name}",
            f"{len(v)} times, {sum(v) * 1000:.0f} ms in all, longest {max(v) * 1000:.0f} ms",
        )
        for name, v in ranked
    ]


LOADS = ("uploads", "reports", "solves")


def healthz_under_load(
    seconds: float, *, loop_trace: bool = False, loads: tuple[str, ...] = LOADS
) -> list[tuple[str, str]]:
    """``/healthz`` latency while uploads, large reports and solve completions run.

    The running work is ``loads``.
    """
    import json

    import httpx

    from perseus_server import ServerProcess

    ctx = mp.get_context("spawn")
    rows: list[tuple[str, str]] = []
    lines = PROFILE.read_text().splitlines()
    body = "\n".join(lines)
    stages = 4
    small = "\n".join([lines[0]] + [x for x in lines[1:] if int(x.split(",")[0]) < stages])
    record = {"stage": 0, "instruction": "forward", "frequency": 1740, "time": 0.1, "energy": 1}
    bad_json = json.dumps({"records": [record] * 180_000})  # ~15 MB; duplicates: a 422
    env = {"PYTHONASYNCIODEBUG": "1"} if loop_trace else None
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(Path(tmp) / "bench.db", env=env) as srv,
    ):
        http = httpx.Client(base_url=srv.http_url, timeout=600)
        spec = {"stages": stages, "microbatches": 32, "blocking_power": 70.38}
        solve_job = http.post("/jobs", json=spec).json()["id"]
        http.put(f"/jobs/{solve_job}/profile", content=small).raise_for_status()
        upload_job = http.post("/jobs", json={**spec, "stages": 8}).json()["id"]
        stop = ctx.Event()
        pa, pb_ = ctx.Pipe()
        ra, rb = ctx.Pipe()
        probe = ctx.Process(target=probe_healthz, args=(srv.http_url, stop, pb_), daemon=True)
        rep = ctx.Process(
            target=_reporter, args=(srv.grpc_target, solve_job, stop, rb), daemon=True
        )
        uploads = solves = 0
        if "solves" not in loads:  # the reports' job still gets its plan (solved before)
            http.post(f"/jobs/{solve_job}/frontier").raise_for_status()
            wait_frontier(http, solve_job)
        probe.start()
        if "reports" in loads:
            rep.start()
        end = time.perf_counter() + seconds
        try:
            if "solves" in loads:
                http.post(f"/jobs/{solve_job}/frontier").raise_for_status()
            while time.perf_counter() < end:
                if "uploads" in loads:
                    r = http.put(f"/jobs/{upload_job}/profile", content=body)
                    assert r.status_code == 200
                    r = http.put(
                        f"/jobs/{upload_job}/profile",
                        content=bad_json,
                        headers={"content-type": "application/json"},
                    )
                    assert r.status_code == 422, r.text[:200]
                    uploads += 2
                else:
                    time.sleep(0.05)
                if "solves" in loads:
                    st = http.get(f"/jobs/{solve_job}/frontier", params={"points": False}).json()
                    if st["status"] in ("done", "failed"):
                        solves += st["status"] == "done"
                        http.post(f"/jobs/{solve_job}/frontier").raise_for_status()
        finally:
            stop.set()
        lat, errors = pa.recv()
        reports = ra.recv() if "reports" in loads else 0
        probe.join(30)
        if "reports" in loads:
            rep.join(30)
        http.close()
        log = srv.output()
    ran = {
        "uploads": f"{uploads} uploads, a 52 KB CSV and a 15 MB malformed JSON in turn",
        "reports": f"{reports} reports of 100k measurements",
        "solves": f"{solves} solve completions",
    }
    rows.append(
        (
            f"/healthz under load ({seconds:g} s: {', '.join(ran[k] for k in LOADS if k in loads)})",
            f"{latency(lat)} over {len(lat)} probes, {errors} failed",
        )
    )
    if loop_trace:
        rows += slow_callbacks(log) or [("  slow callbacks", "none over 100 ms")]
    return rows


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs ``python -m perseus_server`` from the source tree ``tree``.

    ``tree`` is a ``git worktree`` of another commit: its packages first on the path, and not
    the current directory (``PYTHONSAFEPATH``), which would put this tree's ``perseus`` before
    them.
    """
    parts = [tree, tree / "server", tree / "client", tree / "common"]
    return {"PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(str(p) for p in parts)}


def load_average() -> str:
    """The machine's load average (1, 5 and 15 minutes)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def query_run(url: str, job_id: str, args: argparse.Namespace) -> str:
    """One query load against ``url``: requests/s, p50 and p99 (ms)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(
        target=_query_load,
        args=(url, job_id, args.seconds, args.concurrency, child, args.client),
    )
    p.start()
    lat, wall = parent.recv()
    p.join()
    return (
        f"{len(lat) / wall:.0f} req/s, p50 {pct(lat, 0.5):.2f} ms, "
        f"p99 {pct(lat, 0.99):.2f} ms ({len(lat)} requests)"
    )


_PUSH_BUCKET = re.compile(r'^perseus_push_latency_seconds_bucket\{le="([^"]+)"\} (\S+)$', re.M)


def push_buckets(http: Any) -> dict[float, float]:
    """The server's ``perseus_push_latency_seconds`` histogram: writes within each bound (s)."""
    text = http.get("/metrics").text
    return {float(le): float(n) for le, n in _PUSH_BUCKET.findall(text)}


def written_within(before: dict[float, float], after: dict[float, float]) -> float:
    """The least bound (s) within which the server wrote every message between two readings."""
    delta = {le: after[le] - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    return min((le for le, n in delta.items() if n >= total), default=float("inf"))


def push_run(
    target: str, http: Any, job_id: str, n: int, args: argparse.Namespace, pipelines: int
) -> str:
    """``n`` WatchPlan streams from ``args.procs`` processes, then ``args.rounds`` deployments.

    The time from just before each ``PUT /plan`` until the last stream had the new version;
    and, from the server's ``perseus_push_latency_seconds``, the bucket within which the server
    itself had written every stream's message (the rest is the client processes' share).
    """
    ctx = mp.get_context("spawn")
    ranks = [
        (d * STAGES * TENSOR + s * TENSOR + t, s, d, t)
        for d in range(pipelines)
        for s in range(STAGES)
        for t in range(TENSOR)
    ][:n]
    pipes, procs = [], []
    for chunk in (ranks[i :: args.procs] for i in range(args.procs)):
        a, b = ctx.Pipe()
        pr = ctx.Process(target=_watchers, args=(target, job_id, chunk, b), daemon=True)
        pr.start()
        pipes.append(a)
        procs.append(pr)
    retried = sum(c.recv()[1] for c in pipes)
    times, written = [], []
    for r in range(args.rounds):
        before = push_buckets(http)
        t_put = time.time()
        dep = http.put(f"/jobs/{job_id}/plan", json={"slowdown": (r % 2) * 0.1 + 0.001 * r})
        version = dep.json()["version"]
        for c in pipes:
            c.send(("wait", version))
        times.append(max(c.recv()[1] for c in pipes) - t_put)
        written.append(written_within(before, push_buckets(http)))
    for c in pipes:
        c.send(("stop",))
    for pr in procs:
        pr.join(30)
    return (
        f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
        f"over {args.rounds} deployments (server wrote all within "
        f"{'/'.join(f'{w * 1000:g}' for w in written)} ms); {retried} calls retried after CANCELLED"
    )


def queries_and_push(args: argparse.Namespace) -> int:
    """The plan-query and push measurements of this tree's server, and of a baseline's.

    With ``--baseline``, of the baseline tree's side by side (both running; the runs alternate).
    """
    import httpx

    from perseus_server import ServerProcess

    microbatches = 8 if args.smoke else MICROBATCHES
    pipelines = max(1, -(-max(args.streams) // (STAGES * TENSOR)))
    trees = [("this", None)] + ([("baseline", Path(args.baseline))] if args.baseline else [])
    print("measurement  result")

    def row(what: str, result: str) -> None:
        print(f"{what}  {result}", flush=True)  # as it comes: a long run shows its progress

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        servers = {}
        for name, tree in trees:
            env = None if tree is None else tree_env(tree.resolve())
            srv = stack.enter_context(ServerProcess(tmp / f"{name}.db", env=env))
            http = stack.enter_context(httpx.Client(base_url=srv.http_url, timeout=600))
            servers[name] = (srv, http, start_job(http, microbatches, pipelines, TENSOR))
        for name, (_, http, job) in servers.items():
            st = wait_frontier(http, job["id"], 0.5)
            if st["status"] != "done":
                print(f"{name}: solve failed:", st["error"])
                return 1
            for k in range(50):  # every query answered once (the same warm-up for both)
                http.get(_query_path(job["id"], k)).raise_for_status()
            row(f"{name}: frontier", f"{st['num_points']} points, job {job['id']}")
        order = list(servers)
        for r in range(args.query_rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                srv, http, job = servers[name]
                label = f"GET /plan?slowdown (concurrency {args.concurrency}, {args.client})"
                got = query_run(srv.http_url, job["id"], args)
                row(f"{name}: {label} #{r + 1}", f"{got}; load {load_average()}")
        for n in args.streams:
            for name in order:
                srv, http, job = servers[name]
                label = f"push to {n} WatchPlan streams ({args.procs} client processes)"
                got = push_run(srv.grpc_target, http, job["id"], n, args, pipelines)
                row(f"{name}: {label}", f"{got}; load {load_average()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--streams", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--healthz-under-load",
        type=float,
        metavar="SECONDS",
        help="measure /healthz latency under upload, report and solve load instead",
    )
    ap.add_argument(
        "--loads",
        nargs="+",
        choices=LOADS,
        default=list(LOADS),
        help="with --healthz-under-load: the loads to run (default: all three at once)",
    )
    ap.add_argument(
        "--loop-trace",
        action="store_true",
        help="with --healthz-under-load: list the event-loop callbacks that ran over 100 ms",
    )
    ap.add_argument(
        "--status-load",
        type=float,
        metavar="SECONDS",
        help="measure GET status and /healthz at the largest registration instead",
    )
    ap.add_argument("--ranks", type=int, default=4096, help="with --status-load (default 4096)")
    ap.add_argument(
        "--clocks", type=int, help="with --status-load: clocks per rank (default: most)"
    )
    ap.add_argument("--name-chars", type=int, help="with --status-load: GPU/host name length")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="a small run: with --status-load 64 ranks, 1 s; else 8 microbatches, 1 s, 16 streams",
    )
    ap.add_argument(
        "--baseline",
        metavar="TREE",
        help="also run the server of another source tree (a git worktree of an older commit) "
        "and alternate the runs: the comparison side by side",
    )
    ap.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="the query load generator: raw sockets (default) or httpx.AsyncClient",
    )
    ap.add_argument("--query-rounds", type=int, default=2, help="query runs per server")
    args = ap.parse_args(argv)
    if args.smoke and not args.status_load:
        args.seconds, args.streams, args.rounds, args.procs = 1.0, [16], 1, 1
    if args.status_load:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from benchmarks.status_load import status_under_load

        ranks, seconds = (64, 1.0) if args.smoke else (args.ranks, args.status_load)
        print_rows(
            status_under_load(ranks, seconds, clocks=args.clocks, name_chars=args.name_chars)
        )
        return 0
    if args.healthz_under_load:
        rows = healthz_under_load(
            args.healthz_under_load, loop_trace=args.loop_trace, loads=tuple(args.loads)
        )
        for a, b in rows:
            print(f"{a}\n  {b}")
        return 0

    return queries_and_push(args)


if __name__ == "__main__":
    sys.exit(main())
