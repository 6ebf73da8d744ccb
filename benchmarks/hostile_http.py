"""Hostile-client figures against a real ``perseus serve`` (loopback).

What invented names do to ``/metrics``, what a CL.TE request does to memory and framing, whether
``/healthz`` answers while slow bodies hold ``--max-connections``, whether an open server obeys a
foreign ``Host``, and what an out-of-range report does to ``PUT /power-budget``.

    python benchmarks/hostile_http.py [--names 1500] [--smuggle-mib 120] [--smoke]

Each row is measured on a fresh server; the same script measures a server from before the
fixes (run it with that tree first on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
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


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _addr(srv: ServerProcess) -> tuple[str, int]:
    host, port = srv.http_url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def metrics_growth(tmp: Path, names: int) -> str:
    with ServerProcess(tmp / "m.db", token="t0ken") as srv:
        auth = {"Authorization": "Bearer t0ken"}
        before = httpx.get(srv.http_url + "/metrics", headers=auth).text
        rss0 = _rss_mib(srv.pid)
        for i in range(names):
            with socket.create_connection(_addr(srv), timeout=10) as s:
                s.sendall(f"M{i} /x/{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                s.recv(4096)
        with grpc.insecure_channel(srv.grpc_target) as ch:
            for i in range(names):
                with contextlib.suppress(grpc.RpcError):
                    ch.unary_unary(f"/perseus.v1.PlanService/M{i}")(b"", timeout=10)
        t = time.perf_counter()
        after = httpx.get(srv.http_url + "/metrics", headers=auth, timeout=60).text
        took = (time.perf_counter() - t) * 1000
        return (
            f"{_series(before)} -> {_series(after)} series, /metrics {len(before) / 1024:.1f} -> "
            f"{len(after) / 1024:.1f} KiB (render {took:.0f} ms), RSS +{_rss_mib(srv.pid) - rss0:.0f}"
            " MiB"
        )


def smuggling(tmp: Path, mib: int) -> str:
    with ServerProcess(tmp / "s.db") as srv:
        rss0 = _rss_mib(srv.pid)
        behind = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        chunk = b"x" * (1 << 20)
        body = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * mib + b"0\r\n\r\n"
        head = (
            b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        data, peak = b"", rss0
        with socket.create_connection(_addr(srv), timeout=30) as s:
            with contextlib.suppress(OSError):
                s.sendall(head + body + behind)
            s.settimeout(5)
            while True:
                peak = max(peak, _rss_mib(srv.pid))
                try:
                    got = s.recv(65536)
                except (TimeoutError, OSError):
                    break
                if not got:
                    break
                data += got
        first = data.split(b"\r\n", 1)[0].decode(errors="replace")
        return f"{data.count(b'HTTP/1.1 ')} responses (first: {first}), RSS +{peak - rss0:.0f} MiB"


def slow_bodies(tmp: Path, cap: int, seconds: float) -> str:
    args = ["--max-connections", str(cap), "--header-timeout", "2"]
    with ServerProcess(tmp / "b.db", extra_args=args) as srv:
        stop = threading.Event()

        def trickle() -> None:
            try:
                s = socket.create_connection(_addr(srv), timeout=5)
                s.sendall(
                    b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n"
                )
                while not stop.is_set():
                    s.sendall(b" ")
                    time.sleep(0.2)
            except OSError:
                pass

        threads = [threading.Thread(target=trickle, daemon=True) for _ in range(cap)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        ok = total = 0
        lat: list[float] = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            total += 1
            t0 = time.perf_counter()
            try:
                ok += httpx.get(srv.http_url + "/healthz", timeout=2).status_code == 200
                lat.append(time.perf_counter() - t0)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        stop.set()
        med = sorted(lat)[len(lat) // 2] * 1000 if lat else float("nan")
        return f"/healthz answered {ok}/{total} probes in {seconds:.0f} s (median {med:.0f} ms)"


def rebinding(tmp: Path) -> str:
    with ServerProcess(tmp / "r.db") as srv:
        c = httpx.Client(base_url=srv.http_url, timeout=30)
        body = {"stages": 2, "microbatches": 4, "blocking_power": 70.0, "gpu_model": "A40"}
        job = c.post("/jobs", json=body).json()["id"]
        port = srv.http_url.rsplit(":", 1)[-1]
        r1 = c.post(
            f"/jobs/{job}/frontier",
            headers={"Origin": "http://attacker.example", "Content-Type": "text/plain"},
        )
        r2 = c.delete(f"/jobs/{job}", headers={"Host": f"attacker.example:{port}"})
        return f"cross-site POST /frontier {r1.status_code}, DELETE with a foreign Host {r2.status_code}"


def huge_report(tmp: Path) -> str:
    csv = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
    lines = csv.read_text().splitlines()
    freqs = sorted({int(x.split(",")[2]) for x in lines[1:]}, reverse=True)[::10]
    keep = [x for x in lines[1:] if int(x.split(",")[0]) < 2 and int(x.split(",")[2]) in freqs]
    with ServerProcess(tmp / "p.db") as srv:
        c = httpx.Client(base_url=srv.http_url, timeout=60)
        spec = {"stages": 2, "microbatches": 4, "blocking_power": 70.38, "data_parallel": 2}
        job = c.post("/jobs", json={**spec, "gpu_model": "A40"}).json()["id"]
        c.put(f"/jobs/{job}/profile", content="\n".join([lines[0], *keep]) + "\n",
              headers={"content-type": "text/csv"}).raise_for_status()  # fmt: skip
        c.post(f"/jobs/{job}/frontier").raise_for_status()
        while c.get(f"/jobs/{job}/frontier").json()["status"] not in ("done", "failed"):
            time.sleep(0.2)
        version = c.get(f"/jobs/{job}/status").json()["plan"]["version"]
        c.put(f"/jobs/{job}/straggler-detection",
              json={"threshold": 0.01, "consecutive": 1, "recovery": 0.0})  # fmt: skip
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            rank = stub.RegisterRank(
                pb.RegisterRankRequest(job_id=job, global_rank=0, pipeline_rank=0)
            ).rank_id
            # pipeline 0 complete: the job draws on a power budget
            stub.RegisterRank(pb.RegisterRankRequest(job_id=job, global_rank=1, pipeline_rank=1))
            rep = pb.IterationReport(job_id=job, rank_id=rank, iteration=1, iteration_time=1e308,
                                     plan_version=version, sequence=1)  # fmt: skip
            try:
                stub.ReportIterations(iter([rep]), timeout=30)
                verdict = "accepted"
            except grpc.RpcError as e:
                verdict = f"{e.code().name} ({e.details()[:40]})"
        r = c.put("/power-budget", json={"watts": 1.0})
        return f"iteration_time=1e308: {verdict}; PUT /power-budget then {r.status_code}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=1500)
    ap.add_argument("--smuggle-mib", type=int, default=120)
    ap.add_argument("--smoke", action="store_true", help="small: 50 names, 8 MiB, 3 s")
    args = ap.parse_args(argv)
    names, mib, secs = (50, 8, 3.0) if args.smoke else (args.names, args.smuggle_mib, 10.0)
    rows: list[tuple[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows.append(
            (f"{names} + {names} invented names, unauthenticated", metrics_growth(tmp, names))
        )
        rows.append((f"CL.TE request with a {mib} MiB chunked body", smuggling(tmp, mib)))
        rows.append(("16 slow bodies at --max-connections 16", slow_bodies(tmp, 16, secs)))
        rows.append(("open server, foreign Host and Origin", rebinding(tmp)))
        rows.append(("one report out of physical range", huge_report(tmp)))
    width = max(len(a) for a, _ in rows)
    print(f"{'case'.ljust(width)}  result")
    for a, b in rows:
        print(f"{a.ljust(width)}  {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
