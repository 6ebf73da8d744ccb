"""Failover of two ``perseus serve`` processes on one PostgreSQL database.

    python benchmarks/failover.py [--rounds 10] [--lease 5]
    python benchmarks/failover.py --smoke   # 1 round, a 1 s lease (the suite's)

Starts a PostgreSQL server (``initdb`` / ``pg_ctl``, PostgreSQL's default durability), a leader
and a standby with ``--leader-lease``, and solves one job. A rank of it reports iterations to
the leader (sequence-numbered, acknowledged). Each round then faults the leader, alternating
SIGKILL and SIGSTOP (a hang longer than the lease; the stopped server is resumed once the
standby leads, and must stop itself, exit status 3), and measures: the time from the fault to
the standby's ``perseus: leader`` line, to its ``/healthz``, and to the rank's first plan from it
(a ``WatchPlan`` stream to the new leader's address: following the leader among several
addresses is the client's part). Afterwards the faulted server is started again as the next
standby. Every acknowledged report is looked for in the database after each round ("lost"; of
the newest 256, what the server keeps of a rank),
and the plan version the rank receives must never go down.

Needs PostgreSQL installed (Debian's ``postgresql``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"


def _small_profile() -> str:
    lines = PROFILE.read_text().splitlines()
    keep = {f for f in sorted({int(x.split(",")[2]) for x in lines[1:]})[::10]}
    rows = [x for x in lines[1:] if int(x.split(",")[0]) < 2 and int(x.split(",")[2]) in keep]
    return "\n".join([lines[0], *rows]) + "\n"


def _wait_line(srv: Any, text: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while text not in srv.output():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {text!r} after {timeout} s:\n{srv.output()[-3000:]}")
        time.sleep(0.01)
    return time.monotonic()


def _start(srv: Any) -> threading.Thread:
    """Start ``srv`` (a standby: its start returns once it leads) on a thread."""

    def run() -> None:
        with contextlib.suppress(RuntimeError):  # stopped while a standby, at the end
            srv.start()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    _wait_line(srv, "perseus: standby", 60)
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="failovers (SIGKILL and SIGSTOP)")
    ap.add_argument("--lease", type=float, default=5.0, help="--leader-lease of both servers")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--smoke", action="store_true", help="1 round, a 1 s lease")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rounds, args.lease = 1, 1.0

    import grpc
    import httpx

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc
    from perseus_server import Limits, ServerProcess
    from perseus_server.runtime.postgres_store import PostgresStore
    from perseus_server.testing.postgres import PostgresServer

    opts = ["--leader-lease", str(args.lease)]
    rows: list[dict[str, Any]] = []
    with PostgresServer(durable=True) as pg:
        url = pg.create_database("failover")
        leader = ServerProcess(url, extra_args=opts).start()
        with httpx.Client(base_url=leader.http_url, timeout=60.0) as http:
            job = http.post("/jobs", json={"stages": 2, "microbatches": 4, "blocking_power": 70.38})
            job_id = job.json()["id"]
            http.put(
                f"/jobs/{job_id}/profile",
                content=_small_profile(),
                headers={"content-type": "text/csv"},
            )
            http.post(f"/jobs/{job_id}/frontier")
            while http.get(f"/jobs/{job_id}/frontier").json()["status"] != "done":
                time.sleep(0.1)
        with grpc.insecure_channel(leader.grpc_target) as ch:
            rank_id = (
                pb_grpc.PlanServiceStub(ch)
                .RegisterRank(
                    pb.RegisterRankRequest(
                        job_id=job_id, global_rank=0, pipeline_rank=0, data_rank=0
                    ),
                    timeout=10,
                )
                .rank_id
            )
        seq, acked, last_version = 0, [], 0

        def report(srv: Any, n: int = 20) -> None:
            nonlocal seq
            batch = []
            for _ in range(n):
                seq += 1
                batch.append(
                    pb.IterationReport(
                        job_id=job_id,
                        rank_id=rank_id,
                        iteration=seq,
                        iteration_time=1.0,
                        plan_version=1,
                        sequence=seq,
                    )  # fmt: skip
                )
            with grpc.insecure_channel(srv.grpc_target) as ch:
                pb_grpc.PlanServiceStub(ch).ReportIterations(iter(batch), timeout=10)
            acked.extend(r.iteration for r in batch)

        standby = ServerProcess(url, extra_args=opts)
        starting = _start(standby)
        for i in range(args.rounds):
            fault = "SIGKILL" if i % 2 == 0 else "SIGSTOP"
            report(leader)
            with httpx.Client(base_url=leader.http_url, timeout=60.0) as http:
                deployed = http.put(f"/jobs/{job_id}/plan", json={"index": i % 2}).json()
            deployed_version = int(deployed["version"])
            t0 = time.monotonic()
            if fault == "SIGKILL":
                leader.kill()
            else:
                os.kill(leader.pid, signal.SIGSTOP)
            t_lead = _wait_line(standby, "perseus: leader", 120) - t0
            starting.join(120)
            t_ready = time.monotonic() - t0
            with grpc.insecure_channel(standby.grpc_target) as ch:
                stream = pb_grpc.PlanServiceStub(ch).WatchPlan(
                    pb.WatchPlanRequest(job_id=job_id, rank_id=rank_id), timeout=30
                )
                first = next(iter(stream))
                t_plan = time.monotonic() - t0
                stream.cancel()
            backwards = first.version < max(last_version, deployed_version)
            last_version = max(last_version, first.version)
            deposed = None
            if fault == "SIGSTOP":
                os.kill(leader.pid, signal.SIGCONT)
                deadline = time.monotonic() + 60
                while leader.returncode is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                deposed = leader.returncode
            report(standby)
            store = PostgresStore.open(url, pool_size=1)
            try:
                stored = {it[0] for it in store.iterations(rank_id, 10**6)}
            finally:
                store.close()
            rows.append(
                {
                    "round": i + 1,
                    "fault": fault,
                    "to_leader_s": t_lead,
                    "to_ready_s": t_ready,
                    "to_plan_s": t_plan,
                    "plan_version": first.version,
                    "deployed_version": deployed_version,
                    "version_went_back": backwards,
                    "deposed_exit": deposed,
                    # the server keeps a rank's newest ``history_per_rank`` iterations
                    "lost": len(set(acked[-Limits().history_per_rank :]) - stored),
                }
            )
            leader.stop()
            leader, standby = standby, ServerProcess(url, extra_args=opts)
            starting = _start(standby)
        standby.stop()
        leader.stop()
    if args.json:
        print(json.dumps({"lease_s": args.lease, "rounds": rows}))
        return 0
    print(f"lease {args.lease:g} s; times from the fault; lost: acknowledged reports not stored")
    print(f"{'#':>3} {'fault':<8} {'leader s':>9} {'ready s':>8} {'plan s':>7} "
          f"{'deployed':>9} {'received':>9} {'deposed':>8} {'lost':>5}")  # fmt: skip
    for r in rows:
        print(
            f"{r['round']:>3} {r['fault']:<8} {r['to_leader_s']:>9.2f} {r['to_ready_s']:>8.2f} "
            f"{r['to_plan_s']:>7.2f} {r['deployed_version']:>9d} {r['plan_version']:>9d} "
            f"{str(r['deposed_exit'] or '-'):>8} "
            f"{r['lost']:>5d}"
        )
    for fault in ("SIGKILL", "SIGSTOP"):
        got = [r["to_plan_s"] for r in rows if r["fault"] == fault]
        if got:
            print(f"{fault}: plan from the new leader after {statistics.median(got):.2f} s median, "
                  f"{max(got):.2f} s max")  # fmt: skip
    print(f"acknowledged reports lost: {sum(r['lost'] for r in rows)}; "
          f"versions went back: {sum(r['version_went_back'] for r in rows)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
