"""Per-clock transfer times on gloo, quiet and beside busy processes: what the link fit decides.

Two torch ranks over gloo run a 2-stage pipeline's P2P pattern: per microbatch, stage 0 sends an
activation to stage 1 and stage 1 sends a gradient back, with a little compute on each side.
Both ends time every transfer as the integrations do (from posting the op to the end of its
wait, on the CPU). The run is split into ``--clocks`` scan steps of ``--reports`` measured
iterations each (after one warm-up), as an online-profiling scan is; the clocks are labels only
(gloo does not depend on the SM clock, which is the point). The server's own code then does
what online profiling does with the reports: per iteration the ends' times combined
(``LinkCombiner``: per microbatch the smaller end, then the median), kept per link and clock
(``TransferSamples``), and fitted (``fit_transfers``).

Printed per link: the per-clock medians, their spread (max / min), the within-clock noise (the
pooled IQR of the residuals / 1.349), the dependence statistic (``clock_dependence``: the largest
difference of two per-clock medians in standard errors) and the fit: per clock (the data shows a
dependence beyond ``DEPENDENCE_Z``) or one time. "old" is what the previous rule used: the
per-clock medians whenever more than one clock was measured. ``--load`` starts two busy loops
(``while True: pass``) beside the ranks for the whole run.

    python benchmarks/link_noise.py [--load] [--clocks 8] [--reports 5] [--microbatches 8]
    python benchmarks/link_noise.py --smoke     # 2 clocks x 3 reports (the suite's)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def rank_main(
    rank: int, clocks: int, reports: int, microbatches: int, width: int, out: Path
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    peer = 1 - rank
    x = torch.randn(16, width)
    w = torch.randn(width, width)
    buf = torch.empty(16, width)
    iterations: list[list[tuple[int, str, int, float]]] = []

    def timed(op: Any, tensor: Any) -> float:
        t0 = time.perf_counter()
        op(tensor, peer).wait()
        return time.perf_counter() - t0

    for _ in range(clocks * (reports + 1)):
        rec: list[tuple[int, str, int, float]] = []
        for mb in range(microbatches):
            if rank == 0:
                y = x @ w  # forward compute
                rec.append((0, "forward", mb, timed(dist.isend, y)))
                rec.append((0, "backward", mb, timed(dist.irecv, buf)))
            else:
                rec.append((0, "forward", mb, timed(dist.irecv, buf)))
                g = buf @ w  # backward compute
                rec.append((0, "backward", mb, timed(dist.isend, g)))
        iterations.append(rec)
    dist.barrier()
    dist.destroy_process_group()
    out.write_text(json.dumps(iterations))


def busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from perseus_server.decisions.link_fit import (
        DEPENDENCE_Z,
        MIN_PER_CLOCK,
        LinkCombiner,
        TransferSamples,
        clock_dependence,
        fit_transfers,
        median,
    )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    load = busy_loops(2) if args.load else []
    load0 = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            outs = [Path(tmp) / f"rank{r}.json" for r in range(2)]
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE),
                        "--child",
                        str(r),
                        "--out",
                        str(outs[r]),
                        "--clocks",
                        str(args.clocks),
                        "--reports",
                        str(args.reports),
                        "--microbatches",
                        str(args.microbatches),
                        "--width",
                        str(args.width),
                    ],
                    env=env,
                )
                for r in range(2)
            ]
            if any(p.wait(timeout=600) for p in procs):
                raise SystemExit("a rank failed")
            per_rank = [json.loads(o.read_text()) for o in outs]
    finally:
        for p in load:
            p.kill()
    load1 = os.getloadavg()[0]
    clocks = [1410 - 60 * i for i in range(args.clocks)]  # labels of the scan's steps
    combiner = LinkCombiner()
    samples = TransferSamples()
    for i in range(len(per_rank[0])):
        step, k = divmod(i, args.reports + 1)
        times: dict[tuple[int, str], float] = {}
        for r, iterations in enumerate(per_rank):
            groups: dict[tuple[int, str], list[tuple[int, float]]] = {}
            for b, d, mb, t in iterations[i]:
                groups.setdefault((b, d), []).append((mb, t))
            for link, ts in groups.items():
                for m in combiner.add(link, f"rank{r}", i, ts):
                    times[link] = m
        if k > 0:  # the first iteration of each step is its warm-up
            samples.add(clocks[step], times)
    fits = fit_transfers(samples)
    out: dict[str, Any] = {
        "load": args.load,
        "load_average_1min": [load0, load1],
        "dependence_z": DEPENDENCE_Z,
        "min_per_clock": MIN_PER_CLOCK,
        "links": {},
    }
    for (b, d), fit in fits.items():
        per_clock = {f: v for (bb, dd, f), v in samples.samples.items() if (bb, dd) == (b, d)}
        medians = {f: median(v) for f, v in per_clock.items()}
        residuals = sorted(x - medians[f] for f, v in per_clock.items() for x in v)
        q = len(residuals) // 4
        out["links"][f"{b}/{d}"] = {
            "per_clock_ms": {f: 1e3 * m for f, m in sorted(medians.items(), reverse=True)},
            "spread": max(medians.values()) / min(medians.values()),
            "noise_ms": 1e3 * (residuals[-1 - q] - residuals[q]) / 1.349,
            "z": clock_dependence(per_clock),
            "fit": "per clock" if fit.times_by_clock else "one time",
            "fit_ms": 1e3 * fit.time,
            "old_per_clock": len(medians) > 1,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clocks", type=int, default=8)
    ap.add_argument("--reports", type=int, default=5)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--width", type=int, default=4096, help="activation width (16 rows, fp32)")
    ap.add_argument("--load", action="store_true", help="two busy loops beside the ranks")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="2 clocks x 3 reports, 2 microbatches")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.clocks, args.reports, args.microbatches, args.width = 2, 3, 2, 256
    if args.child is not None:
        rank_main(args.child, args.clocks, args.reports, args.microbatches, args.width, args.out)
        return
    res = run(args)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    l0, l1 = res["load_average_1min"]
    print(
        f"gloo, 2 ranks, {args.clocks} clocks x {args.reports} reports x {args.microbatches} "
        f"microbatches, {'two busy loops beside' if args.load else 'quiet'} (load {l0:.1f}-{l1:.1f}); "
        f"per clock only beyond z > {res['dependence_z']}"
    )
    for link, r in res["links"].items():
        medians = " ".join(f"{m:.3f}" for m in r["per_clock_ms"].values())
        print(
            f"{link:<11} per-clock medians (ms) {medians}; spread x{r['spread']:.2f}, noise "
            f"{r['noise_ms']:.3f} ms, z {r['z']:.2f} -> {r['fit']} ({r['fit_ms']:.3f} ms); "
            f"old rule: {'per clock' if r['old_per_clock'] else 'one time'}"
        )


if __name__ == "__main__":
    main()
