"""The server while it solves a large frontier: ``/healthz`` and plan-query latency, the solve's wall.

    python benchmarks/solve_load.py                          # this tree, A100 tiled 16 x 128
    python benchmarks/solve_load.py --baseline ../solver-base --stages 16 --microbatches 256
    python benchmarks/solve_load.py --smoke                  # small and short (a test runs it)

For each server (this tree's, and with ``--baseline TREE`` the server of another source tree,
e.g. a ``git worktree`` of an older commit, run from its sources; the servers one after the
other, never at once, in the order this, baseline, baseline, this with ``--rounds 2``):

1. ``perseus serve`` on a temporary SQLite file; a small job (A100 8 x 12 1F1B) solved, whose
   plans are then queried;
2. *idle*: for ``--idle`` seconds a probe process sends ``GET /healthz`` and ``GET
   /jobs/{id}/plan?slowdown=s`` (``s`` cycling) in turn, one every 10 ms;
3. *solving*: a job of the shipped GPT-3 A100 profile tiled to ``--stages`` stages (stage ``s``
   takes shipped stage ``s % 8``, as ``benchmarks/scaling.py`` tiles it), ``--microbatches``
   1F1B, has its frontier computed while the probe goes on; the row gives the probes'
   p50 / p99 / max and the solve's wall (from the request to ``done``), CPU (user + sys of the
   server's children: the solve worker) and the load average.

What it compares: a server whose solve worker used one core at the server's priority (before)
and one whose worker uses every core of its affinity at a lower priority
(``perseus_server.runtime.solve_worker.SOLVE_NICENESS``): the solve should finish sooner while
the probes keep their idle latency. On a shared machine read the rows side by side, with their
load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.server import latency, load_average, tree_env  # noqa: E402

A100 = ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
POWER = 83.64


def tiled_csv(stages: int) -> str:
    """The A100 profile's CSV with ``stages`` stages, stage ``s`` taking shipped stage ``s % 8``."""
    lines = A100.read_text().splitlines()
    rows = [x.split(",", 1) for x in lines[1:] if x.strip()]
    shipped = 1 + max(int(s) for s, _ in rows)
    out = [lines[0]]
    for s in range(stages):
        out += [f"{s},{rest}" for st, rest in rows if int(st) == s % shipped]
    return "\n".join(out) + "\n"


def probe(url: str, job_id: str, stop: Any, out: Any) -> None:
    """``/healthz`` and a plan query in turn, one every 10 ms, until ``stop``.

    Sends ``(healthz latencies, plan latencies, failures)`` to ``out``.
    """
    import httpx

    lat: dict[str, list[float]] = {"healthz": [], "plan": []}
    failed = 0
    k = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        out.send("ready")
        while not stop.is_set():
            kind = "healthz" if k % 2 == 0 else "plan"
            path = "/healthz" if kind == "healthz" else f"/jobs/{job_id}/plan"
            params = None if kind == "healthz" else {"slowdown": (k // 2 % 20) * 0.01}
            t0 = time.perf_counter()
            try:
                ok = c.get(path, params=params).status_code == 200
            except httpx.HTTPError:
                ok = False
            lat[kind].append(time.perf_counter() - t0)
            failed += not ok
            k += 1
            time.sleep(0.01)
    out.send((lat["healthz"], lat["plan"], failed))


def _solve(http: Any, stages: int, microbatches: int, csv: str) -> tuple[str, float]:
    """A job of ``stages`` x ``microbatches`` with ``csv``, its frontier computed; id, seconds."""
    spec = {"stages": stages, "microbatches": microbatches, "blocking_power": POWER}
    job = http.post("/jobs", json=spec).json()["id"]
    http.put(f"/jobs/{job}/profile", content=csv).raise_for_status()
    t0 = time.perf_counter()
    http.post(f"/jobs/{job}/frontier").raise_for_status()
    while (st := http.get(f"/jobs/{job}/frontier", params={"points": False}).json())[
        "status"
    ] not in ("done", "failed"):
        time.sleep(0.2)
    if st["status"] != "done":
        raise RuntimeError(f"solve failed: {st.get('error')}")
    return job, time.perf_counter() - t0


def children_cpu(pid: int) -> float:
    """User + sys seconds of process ``pid``'s reaped children (the server's solve workers)."""
    import os

    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def measure(tree: Path | None, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The idle and the solving rows of one server (``tree`` None: this tree's)."""
    import httpx

    from perseus_server import ServerProcess

    ctx = mp.get_context("spawn")
    rows = []
    env = None if tree is None else tree_env(tree.resolve())
    name = "this" if tree is None else f"baseline {tree.name}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(Path(tmp) / "bench.db", env=env) as srv,
        httpx.Client(base_url=srv.http_url, timeout=600) as http,
    ):
        small, _ = _solve(http, 8, 12, tiled_csv(8))
        for phase in ("idle", "solving"):
            stop = ctx.Event()
            a, b = ctx.Pipe()
            p = ctx.Process(target=probe, args=(srv.http_url, small, stop, b), daemon=True)
            p.start()
            assert a.recv() == "ready"
            load = load_average()
            cpu0 = children_cpu(srv.pid)
            wall = None
            if phase == "idle":
                time.sleep(args.idle)
            else:
                csv = tiled_csv(args.stages)
                wall = _solve(http, args.stages, args.microbatches, csv)[1]
            stop.set()
            hz, plan, failed = a.recv()
            p.join(30)
            time.sleep(1.0)  # the server has reaped the solve worker: its CPU is counted
            rows.append(
                {
                    "server": name, "phase": phase, "healthz": hz, "plan": plan,
                    "failed": failed, "solve_wall": wall, "load": load,
                    "solve_cpu": children_cpu(srv.pid) - cpu0 if wall else None,
                }
            )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=128)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of probes with no solve")
    ap.add_argument("--baseline", help="another source tree's server, measured the same way")
    ap.add_argument("--rounds", type=int, default=1, help="runs per server (alternating)")
    ap.add_argument("--smoke", action="store_true", help="8 x 24, 1 s idle (seconds in all)")
    ap.add_argument("--json", action="store_true", help="the rows as JSON (latencies in s)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.stages, args.microbatches, args.idle = 8, 24, 1.0
    trees: list[Path | None] = [None] + ([Path(args.baseline)] if args.baseline else [])
    order = [t for r in range(args.rounds) for t in (trees if r % 2 == 0 else trees[::-1])]
    rows: list[dict[str, Any]] = []
    if not args.json:
        print(f"A100 tiled {args.stages} x {args.microbatches} 1F1B "
              f"({2 * args.stages * args.microbatches} instructions); probes every 10 ms")  # fmt: skip
        print(f"{'server':24} {'phase':8} {'/healthz':44} {'GET plan':44} fail {'solve':>8} "
              f"{'CPU':>7}  load")  # fmt: skip
    for tree in order:
        for r in measure(tree, args):
            rows.append(r)
            if not args.json:
                solve = "-" if r["solve_wall"] is None else f"{r['solve_wall']:7.1f}s"
                cpu = "-" if r["solve_cpu"] is None else f"{r['solve_cpu']:6.1f}s"
                print(f"{r['server']:24} {r['phase']:8} {latency(r['healthz']):44} "
                      f"{latency(r['plan']):44} {r['failed']:4d} {solve:>8} {cpu:>7}  "
                      f"{r['load']}", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
