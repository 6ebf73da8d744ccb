"""The one store (SQLAlchemy Core) against the two stores it replaced, side by side in one run.

The stores of ``e4f82c6`` (``old``: ``SqliteStore`` and ``PostgresStore``, hand-written SQL for
each database) and this tree's ``SqlStore`` (``new``), and any commit named with ``--also`` (the
one store on SQLAlchemy Core's statement execution was ``f836b46``), measured on the same workloads, interleaved: each round
runs both versions one after the other (in alternating order), each in a fresh process whose
``perseus_server`` is that version's (the old one extracted with ``git archive``; everything
else is this tree's). Printed: the median over the rounds of each measure, and each version over ``old``.

- **ingest** (the report path, what every rank's iteration report costs): ``--ranks`` ranks
  send ``--reports`` reports each through the service (decoding, validation, storage and the
  detectors), each awaiting its acknowledgement; reports per second. SQLite on the event loop,
  PostgreSQL off it (what ``perseus serve`` does with each).
- **plan query / deploy** (the plan path): on a solved job, ``GET /jobs/{id}/plan`` with a
  deadline not asked before (the answer is built, not cached) and ``PUT /jobs/{id}/plan`` (the
  plan deployed: stored and pushed), through the REST app in process; milliseconds each.
- **open**: opening an existing store (the schema checked at its revision).

    python benchmarks/store_versions.py [--rounds 7] [--ranks 256] [--reports 10] [--json]
    python benchmarks/store_versions.py --smoke    # 1 round, 16 ranks x 3 reports (the suite's)

Needs git (the old version is read from the repository) and, for PostgreSQL, Debian's
``postgresql``; without it only SQLite is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The commit of the stores the one store replaced.
BASELINE = "e4f82c6"


def _plan_path(store: Any, queries: int) -> dict[str, float]:
    """Median milliseconds of an uncached plan query and of a deployment (REST, in process)."""
    from fastapi.testclient import TestClient

    from perseus.profiles import load_profile
    from perseus_server import Limits
    from perseus_server.rest import create_app
    from perseus_server.service import PerseusService

    p = load_profile(ROOT / "profiles" / "gpt3-175b_a40_8stage.csv")
    keep = set(p.frequencies[::10])
    csv = "stage,instruction,frequency,time,energy\n" + "".join(
        f"{r['stage']},{r['instruction']},{r['frequency']},{r['time']!r},{r['energy']!r}\n"
        for r in p.records()
        if r["stage"] < 2 and r["frequency"] in keep
    )
    service = PerseusService(store, Limits())
    with TestClient(create_app(service), base_url="http://localhost") as http:
        job = http.post("/jobs", json={"stages": 2, "microbatches": 4, "blocking_power": 70.38})
        job_id = job.json()["id"]
        http.put(f"/jobs/{job_id}/profile", content=csv, headers={"content-type": "text/csv"})
        http.post(f"/jobs/{job_id}/frontier")
        while (
            http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json()["status"]
            != "done"
        ):
            time.sleep(0.05)
        front = http.get(f"/jobs/{job_id}/frontier").json()["points"]
        t0, t1 = front[0]["time"], front[-1]["time"]
        query, deploy = [], []
        for i in range(queries):
            deadline = t0 + (t1 - t0) * (i + 0.5) / queries
            t = time.perf_counter()
            r = http.get(f"/jobs/{job_id}/plan", params={"deadline": deadline})
            query.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
            t = time.perf_counter()
            r = http.put(f"/jobs/{job_id}/plan", json={"slowdown": 0.01 * (i % 10 + 1)})
            deploy.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    return {"plan_query_ms": 1000 * statistics.median(query),
            "deploy_ms": 1000 * statistics.median(deploy)}  # fmt: skip


def _open_ms(target: str) -> float:
    from perseus_server.runtime.stores import open_store

    times = []
    for _ in range(5):
        t = time.perf_counter()
        open_store(target, pool_size=1).close()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One version's measures (run in its own process; see the module docstring)."""
    import perseus_server
    from perseus_server.runtime.stores import open_store

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from store import measure  # the report path, as benchmarks/store.py drives it

    out: dict[str, Any] = {"perseus_server": perseus_server.__file__}
    with tempfile.TemporaryDirectory(prefix="perseus-bench-versions-") as tmp:
        targets = {"sqlite": str(Path(tmp) / "perseus.db")}
        if args.pg:
            import psycopg

            name = f"b_{os.getpid()}"
            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            targets["postgresql"] = args.pg.replace("/postgres?", f"/{name}?")
        for kind, target in targets.items():
            store = open_store(target)
            try:
                ingest = measure(store, args.ranks, args.reports, off_loop=kind == "postgresql")
                out[f"{kind}_ingest_reports_per_s"] = ingest["reports_per_s"]
                out.update({f"{kind}_{k}": v for k, v in _plan_path(store, args.queries).items()})
            finally:
                store.close()
            out[f"{kind}_open_ms"] = _open_ms(target)
    return out


def _tree(tmp: Path, rev: str) -> Path:
    """The ``perseus_server`` of ``rev`` extracted under ``tmp`` (its parent on ``sys.path``)."""
    tmp.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "server/perseus_server"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp / "server"


def _run(path: Path | None, args: argparse.Namespace, pg: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--worker", "--ranks", str(args.ranks),
           "--reports", str(args.reports), "--queries", str(args.queries)]  # fmt: skip
    if pg:
        cmd += ["--pg", pg]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _rounds(args: argparse.Namespace, pg: str | None) -> dict[str, list[dict[str, Any]]]:
    """Each round runs every version once, the order rotating from round to round."""
    revs = [BASELINE, *args.also]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in ["old", *args.also, "new"]}
    with tempfile.TemporaryDirectory(prefix="perseus-bench-old-") as tmp:
        trees: dict[str, Path | None] = {"new": None}
        for label, rev in zip(["old", *args.also], revs, strict=True):
            trees[label] = _tree(Path(tmp) / rev, rev)
        labels = list(runs)
        for r in range(args.rounds):
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                run = _run(trees[label], args, pg)
                where = str(trees[label] or ROOT)
                assert run["perseus_server"].startswith(where), (label, run["perseus_server"])
                runs[label].append(run)
    return runs


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per measure: the median of each version over the rounds, and each over ``old``."""
    out = {}
    for key in runs["new"][0]:
        if key == "perseus_server":
            continue
        med = {v: statistics.median(run[key] for run in rs) for v, rs in runs.items()}
        out[key] = {**med, **{f"{v}_over_old": med[v] / med["old"] for v in med if v != "old"}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="rounds (each runs both versions)")
    ap.add_argument("--ranks", type=int, default=256, help="ranks reporting at once (even)")
    ap.add_argument("--reports", type=int, default=10, help="reports each rank sends")
    ap.add_argument("--queries", type=int, default=40, help="plan queries and deployments")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--smoke", action="store_true", help="1 round, 16 ranks x 3 reports")
    ap.add_argument(
        "--also", nargs="*", default=[], metavar="REV", help="more commits to measure alongside"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.smoke:
        args.rounds, args.ranks, args.reports, args.queries = 1, 16, 3, 4
    args.ranks += args.ranks % 2

    from perseus_server.testing.postgres import PostgresServer, postgres_binaries

    if postgres_binaries() is None:
        print("store_versions: PostgreSQL is not installed; SQLite only", file=sys.stderr)
        runs = _rounds(args, None)
    else:
        with PostgresServer(durable=True) as pg:
            runs = _rounds(args, pg.url())
    res = summary(runs)
    if args.json:
        print(json.dumps({"rounds": args.rounds, "ranks": args.ranks, "reports": args.reports,
                          "queries": args.queries, "measures": res}))  # fmt: skip
        return 0
    print(f"{args.rounds} rounds, interleaved; {args.ranks} ranks x {args.reports} reports; "
          f"{args.queries} plan queries and deployments; medians")  # fmt: skip
    labels = ["old", *args.also, "new"]
    print(f"{'measure':<34}" + "".join(f"{v:>10}" for v in labels)
          + "".join(f"{v + '/old':>14}" for v in labels[1:]))  # fmt: skip
    for key, m in res.items():
        print(f"{key:<34}" + "".join(f"{m[v]:>10.2f}" for v in labels)
              + "".join(f"{m[v + '_over_old']:>14.3f}" for v in labels[1:]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
