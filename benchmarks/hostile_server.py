"""What hostile and faulty input does to a real ``perseus serve`` (issue #32, third round).

An amplifying stage selection, reports of 100,000 transfers, a rank timing a link it is not an end
of, a token file swapped for a link to another user's file, a full disk, a step of the wall clock
under the lifecycle. Each row says what the client sees and what it cost the server (time, resident
memory), on a fresh server.

    python benchmarks/hostile_server.py [--smoke] [--json]

To measure a tree from before the fixes, run this script with that tree's ``server``,
``client``, ``common`` and root first on ``PYTHONPATH``. The token-file and full-disk rows need
root (another user's file; a 3 MiB tmpfs); without it they say so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
JOB = {"stages": 4, "microbatches": 4, "blocking_power": 70.0}
NOBODY = 65534


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _profile(stages: int) -> str:
    lines = (ROOT / "profiles" / "gpt3-175b_a40_8stage.csv").read_text().splitlines()
    keep = [x for x in lines[1:] if int(x.split(",")[0]) < stages]
    return "\n".join([lines[0], *keep]) + "\n"


def stage_selection(tmp: Path, ranges: int) -> dict[str, Any]:
    query = ",".join(["0-99999"] * ranges)
    with ServerProcess(tmp / "s.db") as srv, httpx.Client(base_url=srv.http_url) as c:
        job = c.post("/jobs", json=JOB).json()["id"]
        rss0, t0 = _rss_mib(srv.pid), time.perf_counter()
        r = c.put(f"/jobs/{job}/profile", params={"stages": query}, content=_profile(8),
                  headers={"content-type": "text/csv"}, timeout=120)  # fmt: skip
        return {
            "query_bytes": len(query),
            "status": r.status_code,
            "field": r.json().get("field"),
            "seconds": round(time.perf_counter() - t0, 3),
            "rss_growth_mib": round(_rss_mib(srv.pid) - rss0, 1),
        }


def _report(job: str, rank: str, seq: int, transfers: list[tuple[int, float]]) -> Any:
    rep = pb.IterationReport(job_id=job, rank_id=rank, iteration=seq, iteration_time=1.0,
                             sequence=seq)  # fmt: skip
    for i, (boundary, seconds) in enumerate(transfers):
        rep.transfers.add(boundary=boundary, direction="forward", microbatch=i % 4, time=seconds)
    return rep


def _verdict(fn: Any) -> str:
    try:
        fn()
        return "accepted"
    except grpc.RpcError as e:
        return f"{e.code().name}: {(e.details() or '')[:60]}"


def huge_transfers(tmp: Path, n: int, reports: int) -> dict[str, Any]:
    with ServerProcess(tmp / "t.db") as srv, httpx.Client(base_url=srv.http_url) as c:
        job = c.post("/jobs", json=JOB).json()["id"]
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            rank = stub.RegisterRank(pb.RegisterRankRequest(job_id=job)).rank_id
            flood = _report(job, rank, 1, [(0, 0.001)] * n)
            rss0, t0 = _rss_mib(srv.pid), time.perf_counter()
            one = _verdict(lambda: stub.ReportIterations(iter([flood]), timeout=120))
            seconds = time.perf_counter() - t0
            worst, done = 0.0, threading.Event()

            def flood_all() -> None:
                for k in range(reports):
                    rep = _report(job, rank, k + 2, [(0, 0.001)] * n)
                    _verdict(lambda rep=rep: stub.ReportIterations(iter([rep]), timeout=120))
                done.set()

            threading.Thread(target=flood_all, daemon=True).start()
            while not done.is_set():
                t = time.perf_counter()
                c.get("/healthz", timeout=60)
                worst = max(worst, time.perf_counter() - t)
                time.sleep(0.05)
        return {
            "transfers": n,
            "one_report": one,
            "one_report_seconds": round(seconds, 3),
            "reports": reports,
            "healthz_worst_seconds": round(worst, 3),
            "rss_growth_mib": round(_rss_mib(srv.pid) - rss0, 1),
        }


def framing(tmp: Path) -> dict[str, Any]:
    with ServerProcess(tmp / "f.db") as srv, httpx.Client(base_url=srv.http_url) as c:
        job = c.post("/jobs", json=JOB).json()["id"]
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            rank0 = stub.RegisterRank(
                pb.RegisterRankRequest(job_id=job, global_rank=0, pipeline_rank=0)
            ).rank_id
            rep = _report(job, rank0, 1, [(2, 0.4)] * 4)  # boundary 2 links ranks 2 and 3
            return {"rank 0 times boundary 2": _verdict(lambda: stub.ReportIterations(iter([rep])))}


def token_link(tmp: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "needs root (a file owned by another user)"}
    old, theirs = "old-token-0123456789", "their-token-0123456789"
    with ServerProcess(tmp / "k.db", token=old) as srv:
        token_file = Path(srv._tmp.name) / "token"  # where ServerProcess wrote --token-file
        other = tmp / "theirs"
        other.write_text(theirs + "\n")
        other.chmod(0o600)
        os.chown(other, NOBODY, NOBODY)
        token_file.unlink()
        token_file.symlink_to(other)
        os.kill(srv.pid, 1)  # SIGHUP: read the token files again
        time.sleep(1.0)
        with httpx.Client(base_url=srv.http_url) as c:
            as_old = c.get("/jobs", headers={"Authorization": f"Bearer {old}"}).status_code
            as_theirs = c.get("/jobs", headers={"Authorization": f"Bearer {theirs}"}).status_code
        return {"old token": as_old, "the other user's token": as_theirs}


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Any:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def full_disk(tmp: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"skipped": "needs root (mount a 3 MiB tmpfs)"}
    with _tmpfs(tmp / "fs", "3m") as fs, ServerProcess(fs / "p.db") as srv:
        c = httpx.Client(base_url=srv.http_url, timeout=30)
        job = c.post("/jobs", json=JOB).json()["id"]
        ch = grpc.insecure_channel(srv.grpc_target)
        stub = pb_grpc.PlanServiceStub(ch)
        rank = stub.RegisterRank(pb.RegisterRankRequest(job_id=job)).rank_id
        filler = fs / "filler"
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            for block in (65536, 512):
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * block)
        acked, r = 0, None
        for _ in range(2000):
            r = c.post("/jobs", json=JOB)
            if r.status_code != 201:
                break
            acked += 1
        assert r is not None
        rep = pb.IterationReport(job_id=job, rank_id=rank, iteration=1, iteration_time=1.0,
                                 sequence=1)  # fmt: skip
        grpc_answer = _verdict(lambda: stub.ReportIterations(iter([rep]), timeout=30))
        metric = [x for x in c.get("/metrics").text.splitlines() if "store_errors" in x[:40]]
        filler.unlink()
        after = c.post("/jobs", json=JOB).status_code
        kept = len(c.get("/jobs", params={"limit": 1000}).json()["jobs"])
        ch.close()
        return {
            "POST /jobs": f"{r.status_code} Retry-After={r.headers.get('retry-after')}",
            "ReportIterations": grpc_answer,
            "metric": metric[-1] if metric else None,
            "after space returns": after,
            "acknowledged jobs kept": f"{kept - 1}/{acked + 1}",  # one more made after
        }


def clock_step() -> dict[str, Any]:
    """A job whose last rank left, then a -3600 s step of the wall clock; in process.

    In process, since stepping this machine's clock is not ours to do; the monotonic clock moves
    on meanwhile.
    """
    from perseus_server.config import Limits
    from perseus_server.domain.jobs import JobSpec
    from perseus_server.runtime.sql_store import SqlStore
    from perseus_server.service import PerseusService
    from perseus_server.service import lifecycle as module

    class Clocks:
        wall, mono = 1.7e9, 1000.0

        def time(self) -> float:
            return self.wall

        def monotonic(self) -> float:
            return self.mono

    clocks, real = Clocks(), module.time
    module.time = clocks  # type: ignore[assignment]
    store = SqlStore.open(":memory:")
    try:
        svc = PerseusService(store, Limits(idle_after_seconds=2.0))
        life = svc.lifecycle
        if hasattr(life, "clock"):
            life.clock, life.wall = clocks.monotonic, clocks.time
        job = svc.create_job(JobSpec(stages=2, microbatches=4, blocking_power=70.0))["id"]
        life.connected(job)
        life.disconnected(job)
        clocks.mono += 3.0
        clocks.wall += 3.0 - 3600.0
        return {"state 3 s after the last rank left, after a -3600 s step": life.view(job)["state"]}
    finally:
        module.time = real  # type: ignore[assignment]
        store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="small: 6 ranges, 10,000 transfers")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    ranges, transfers, reports = (6, 10_000, 2) if args.smoke else (60, 100_000, 20)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows[f"stage selection, {ranges} ranges of 100,000"] = stage_selection(tmp, ranges)
        rows[f"{reports} + 1 reports of {transfers} transfers"] = huge_transfers(
            tmp, transfers, reports
        )
        rows["a rank times a link it does not end"] = framing(tmp)
        rows["token file swapped for a link to another user's 0600 file"] = token_link(tmp)
        rows["database on a full 3 MiB file system"] = full_disk(tmp)
        rows["wall clock stepped back 3600 s"] = clock_step()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    width = max(len(k) for k in rows)
    for k, v in rows.items():
        print(f"{k.ljust(width)}  {'; '.join(f'{a}: {b}' for a, b in v.items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
