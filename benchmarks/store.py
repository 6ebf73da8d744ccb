"""Report ingestion on each store, side by side in one run.

SQLite, PostgreSQL with reports committed in groups off the event loop (what ``perseus serve --db
postgresql://...`` does), and PostgreSQL called on the loop one commit per report (what it would do
without the writer).

    python benchmarks/store.py [--ranks 1024] [--reports 20] [--json]
    python benchmarks/store.py --smoke   # 32 ranks x 5 reports (the suite's)

For each store: a fresh database (SQLite: a file in WAL mode, ``synchronous=NORMAL``, as the
server opens it; PostgreSQL: a server this script starts with ``initdb`` / ``pg_ctl`` and
PostgreSQL's default durability, ``fsync`` and ``synchronous_commit`` on), one job with
``--ranks`` registered ranks, and the service in this process (``PerseusService``, no gRPC:
what is measured is decoding, validation, storage and the detectors). Every rank sends ``--reports``
reports one after the other, each awaiting its acknowledgement as a rank's stream does, all
ranks at once. Printed per store: reports per second, the acknowledgement's latency (p50, p99),
and the event loop's longest stall (a 1 ms ticker's worst lateness: what every other request
waited at most). The last column is the store's rate over SQLite's.

Needs PostgreSQL installed (Debian's ``postgresql``); without it only SQLite is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


async def _ticker(stop: asyncio.Event, worst: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        worst[0] = max(worst[0], time.perf_counter() - t - 0.001)


async def _run(service: Any, job_id: str, ranks: list[str], reports: int) -> dict[str, Any]:
    from perseus_common.proto import perseus_pb2 as pb
    from perseus_server.grpc.received import WireReport

    latencies: list[float] = []

    async def rank(rank_id: str) -> None:
        for it in range(reports):
            await asyncio.sleep(0)  # the next report arrives (a stream's read yields)
            rep = WireReport.of(
                pb.IterationReport(
                    job_id=job_id,
                    rank_id=rank_id,
                    iteration=it,
                    iteration_time=1.0,
                    plan_version=0,
                    energy=100.0,
                    sequence=it + 1,
                )  # fmt: skip
            )
            t = time.perf_counter()
            new, dup = await service.ingest_report(rep)
            latencies.append(time.perf_counter() - t)
            assert (new, dup) == (1, 0)

    stop, worst = asyncio.Event(), [0.0]
    ticker = asyncio.create_task(_ticker(stop, worst))
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    await asyncio.gather(*(rank(r) for r in ranks))
    wall = time.perf_counter() - start
    stop.set()
    await ticker
    latencies.sort()
    return {
        "reports": len(latencies),
        "seconds": wall,
        "reports_per_s": len(latencies) / wall,
        "ack_ms_p50": 1000 * statistics.median(latencies),
        "ack_ms_p99": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "loop_stall_ms_max": 1000 * worst[0],
    }


def measure(store: Any, ranks: int, reports: int, off_loop: bool) -> dict[str, Any]:
    """Ingest ``ranks`` x ``reports`` reports into ``store`` through the service."""
    from perseus_common.wire.values import RankRegistration
    from perseus_server import Limits
    from perseus_server.domain.jobs import JobSpec
    from perseus_server.service import PerseusService

    service = PerseusService(store, Limits(), ingest_off_loop=off_loop)
    job_id = service.create_job(JobSpec(stages=2, microbatches=4, data_parallel=ranks // 2))["id"]
    ids = [
        service.registration.register(RankRegistration(job_id, g, g % 2, g // 2)).rank_id
        for g in range(ranks)
    ]

    async def main() -> dict[str, Any]:
        try:
            out = await _run(service, job_id, ids, reports)
        finally:
            await service.shutdown()
        writer = service.report_writer
        out["commits"] = writer.groups if writer is not None else out["reports"]
        return out

    result = asyncio.run(main())
    stored = sum(len(store.iterations(r, reports + 1)) for r in ids)
    assert stored == ranks * reports, f"{stored} reports stored of {ranks * reports}"
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024, help="ranks reporting at once (even)")
    ap.add_argument("--reports", type=int, default=20, help="reports each rank sends")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--smoke", action="store_true", help="32 ranks x 5 reports")
    args = ap.parse_args(argv)
    if args.smoke:
        args.ranks, args.reports = 32, 5
    args.ranks += args.ranks % 2

    from perseus_server.runtime.sql_store import SqlStore
    from perseus_server.testing.postgres import PostgresServer, postgres_binaries

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="perseus-bench-store-") as tmp:
        store = SqlStore.open(Path(tmp) / "perseus.db")
        try:
            results["sqlite"] = measure(store, args.ranks, args.reports, off_loop=False)
        finally:
            store.close()
    if postgres_binaries() is None:
        print("store: PostgreSQL is not installed; measured SQLite only", file=sys.stderr)
    else:
        with PostgresServer(durable=True) as pg:
            for name, off_loop in (("postgresql", True), ("postgresql-on-loop", False)):
                pg_store = SqlStore.open(pg.create_database(name.replace("-", "_")))
                try:
                    results[name] = measure(pg_store, args.ranks, args.reports, off_loop)
                finally:
                    pg_store.close()
    base = results["sqlite"]["reports_per_s"]
    for r in results.values():
        r["vs_sqlite"] = r["reports_per_s"] / base
    if args.json:
        print(json.dumps({"ranks": args.ranks, "reports_per_rank": args.reports, **results}))
        return 0
    print(f"{args.ranks} ranks x {args.reports} reports, each awaiting its acknowledgement")
    print(
        f"{'store':<20} {'reports/s':>10} {'commits':>8} {'ack p50 ms':>11} {'ack p99 ms':>11} "
        f"{'loop stall ms':>14} {'vs sqlite':>10}"
    )
    for name, r in results.items():
        print(
            f"{name:<20} {r['reports_per_s']:>10.0f} {r['commits']:>8d} {r['ack_ms_p50']:>11.2f} "
            f"{r['ack_ms_p99']:>11.2f} {r['loop_stall_ms_max']:>14.1f} {r['vs_sqlite']:>10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
