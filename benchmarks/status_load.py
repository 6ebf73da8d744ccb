"""``benchmarks/server.py --status-load``: what one job's status costs at the largest size.

The largest registration the server allows; also how free ``/healthz`` stays meanwhile (see that
script's docstring).
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.server import PROFILE, STAGES, latency, pct, probe_healthz, solved_job

MICROBATCHES = 8


def _largest_registration() -> tuple[int, int, int]:
    """The most clocks, and the longest GPU and host names, a registration may carry."""
    try:
        from perseus_server.domain.bounds import MAX_GPU_NAME, MAX_HOSTNAME, MAX_SUPPORTED_CLOCKS
    except ImportError:  # a server from before these bounds: what it accepted
        return 1024, 256, 256
    return MAX_SUPPORTED_CLOCKS, MAX_GPU_NAME, MAX_HOSTNAME


def _poll_status(url: str, path: str, go: Any, stop: Any, out: Any) -> None:
    import httpx

    n = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        out.send("ready")
        go.wait()
        while not stop.is_set():
            c.get(path).raise_for_status()
            n += 1
    out.send(n)


def _register(target: str, job_id: str, ranks: int, clocks: int, gpu: int, host: int) -> None:
    import grpc

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc

    freqs = sorted({int(line.split(",")[2]) for line in PROFILE.read_text().splitlines()[1:]})
    supported = freqs + [3000 + i for i in range(max(0, clocks - len(freqs)))]
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.PlanServiceStub(ch)
        futures, ids = [], []
        for g in range(ranks):
            req = pb.RegisterRankRequest(
                job_id=job_id, global_rank=g, pipeline_rank=g % STAGES, data_rank=g // STAGES,
                gpu_name="G" * gpu, supported_clocks_mhz=supported, hostname="h" * host,
            )  # fmt: skip
            futures.append(stub.RegisterRank.future(req, timeout=120))
            if len(futures) >= 64:
                ids += [f.result().rank_id for f in futures]
                futures = []
        ids += [f.result().rank_id for f in futures]
        version = 0
        reports = [
            pb.IterationReport(
                job_id=job_id, rank_id=r, iteration=1, iteration_time=1.0 + 0.001 * (i % 7),
                plan_version=version, energy=100.0, sequence=1,
            )
            for i, r in enumerate(ids)
        ]  # fmt: skip
        stub.ReportIterations(iter(reports), timeout=300)


def status_under_load(
    ranks: int, seconds: float, *, clocks: int | None = None, name_chars: int | None = None
) -> list[tuple[str, str]]:
    """The rows of the ``--status-load`` table."""
    import httpx

    from perseus_server import ServerProcess

    most_clocks, gpu_chars, host_chars = _largest_registration()
    clocks = most_clocks if clocks is None else clocks
    if name_chars is not None:
        gpu_chars = host_chars = name_chars
    ctx = mp.get_context("spawn")
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp) / "bench.db") as srv:
        http = httpx.Client(base_url=srv.http_url, timeout=600)
        job_id = solved_job(http, MICROBATCHES, ranks // STAGES)[0]["id"]
        t0 = time.perf_counter()
        _register(srv.grpc_target, job_id, ranks, clocks, gpu_chars, host_chars)
        rows.append(
            (
                f"register {ranks} ranks ({clocks} clocks, {gpu_chars}/{host_chars}-char names)"
                " and report once each",
                f"{time.perf_counter() - t0:.1f} s",
            )
        )
        path = f"/jobs/{job_id}/status"
        lat, size = [], 0
        for _ in range(max(5, int(seconds * 5))):
            t = time.perf_counter()
            r = http.get(path)
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
            size = len(r.content)
        rows.append(
            (
                f"GET status at {ranks} ranks (default document)",
                f"p50 {pct(lat, 0.5):.1f} ms, p99 {pct(lat, 0.99):.1f} ms, {size / 1024:.0f} KiB",
            )
        )
        t = time.perf_counter()
        pages, total, seen = 0, 0, 0
        after: int | None = None
        while True:
            params: dict[str, Any] = {"ranks": 1024}
            if after is not None:
                params["after"] = after
            r = http.get(path, params=params)
            r.raise_for_status()
            doc = r.json()
            pages, total = pages + 1, total + len(r.content)
            seen += len(doc["ranks"])
            after = doc.get("ranks_next")
            if after is None or not doc["ranks"]:
                break
        rows.append(
            (
                f"GET status, every rank's detail ({pages} pages of up to 1024)",
                f"{(time.perf_counter() - t) * 1000:.0f} ms in all, {total / 1024:.0f} KiB, "
                f"{seen} ranks",
            )
        )
        go, stop = ctx.Event(), ctx.Event()
        pa, pb_ = ctx.Pipe()
        probe = ctx.Process(target=probe_healthz, args=(srv.http_url, stop, pb_, go))
        pollers = []
        for _ in range(2):
            a, b = ctx.Pipe()
            pr = ctx.Process(target=_poll_status, args=(srv.http_url, path, go, stop, b))
            pollers.append((pr, a))
        probe.start()
        for pr, _ in pollers:
            pr.start()
        for conn in [pa] + [a for _, a in pollers]:
            assert conn.recv() == "ready"
        go.set()
        time.sleep(seconds)
        stop.set()
        hz, errors = pa.recv()
        polled = sum(a.recv() for _, a in pollers)
        probe.join()
        for pr, _ in pollers:
            pr.join()
        rows.append(
            (
                "/healthz while 2 clients poll that status back to back",
                f"{latency(hz)} ({len(hz)} probes, {errors} failed; "
                f"{polled / seconds:.0f} status/s, {seconds * 2 / max(polled, 1) * 1000:.0f} ms "
                "each)",
            )
        )
        http.close()
    return rows
