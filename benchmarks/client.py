"""Per-instruction overhead of the Perseus client hooks on the training thread.

Runs a 1F1B-shaped instruction sequence through ``with client.instruction(...)`` with a
:class:`SimulatedGpu` at ``time_scale=0`` (nothing sleeps, so only the hooks' own cost is
measured) and, as the baseline, the same loop with an empty body. Each instruction is timed
individually with ``perf_counter_ns``; the table gives median and p99 in microseconds, and the
overhead (hooked minus empty, medians). Iteration-boundary cost is reported per iteration.

Cases: a plan whose clock changes at every instruction (a controller request per instruction)
and a plan with one clock (every request after the first is a skipped no-op).

    .venv/bin/python benchmarks/client.py [--iterations 300] [--microbatches 8] [--json]

``--nvml`` is the read-only GPU check (needs an NVIDIA GPU; never changes a clock): it lists the
supported SM clocks through :class:`NvmlGpu`, reads the energy counter around a bf16 matmul
workload, and measures the hooks with ``NvmlGpu(dry_run=True)`` and CUDA events (torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from perseus_client import PerseusClient, Plan, PlanStep, SimulatedGpu

PROFILE = {
    (0, "forward"): {1410: (0.010, 3.0), 1200: (0.012, 2.6), 1000: (0.015, 2.4)},
    (0, "backward"): {1410: (0.020, 6.0), 1200: (0.024, 5.2), 1000: (0.030, 4.8)},
}


def one_f_one_b(microbatches: int, warmup: int = 2) -> list[tuple[str, int]]:
    order = [("forward", m) for m in range(min(warmup, microbatches))]
    f, b = len(order), 0
    while b < microbatches:
        if f < microbatches:
            order.append(("forward", f))
            f += 1
        order.append(("backward", b))
        b += 1
    return order


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def bench_empty(order: list[tuple[str, int]], iterations: int) -> list[float]:
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        for _k, _m in order:
            t0 = clock()
            pass
            samples.append((clock() - t0) / 1000.0)
    return samples


def bench_client(
    order: list[tuple[str, int]], iterations: int, clocks: list[int]
) -> tuple[list[float], list[float]]:
    gpu = SimulatedGpu(PROFILE, time_scale=0.0)
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    steps = tuple(PlanStep(k, m, clocks[i % len(clocks)], 0) for i, (k, m) in enumerate(order))
    client.use_plan(Plan(1, steps))
    samples: list[float] = []
    boundaries: list[float] = []
    clock = time.perf_counter_ns
    instruction = client.instruction
    for _ in range(iterations):
        b0 = clock()
        it = client.iteration()
        it.__enter__()
        boundaries.append((clock() - b0) / 1000.0)
        for k, m in order:
            t0 = clock()
            with instruction(k, microbatch=m):
                pass
            samples.append((clock() - t0) / 1000.0)
        b1 = clock()
        it.__exit__(None, None, None)
        boundaries[-1] += (clock() - b1) / 1000.0
    client.close()
    return samples, boundaries


def nvml_check(iterations: int, order: list[tuple[str, int]]) -> dict[str, Any]:
    """Read-only checks on a real GPU (dry run: clock requests are recorded, never applied)."""
    import torch

    from perseus_client import NvmlGpu

    gpu = NvmlGpu(0, dry_run=True)
    clocks = gpu.supported_clocks()
    out: dict[str, Any] = {
        "gpu": gpu.name,
        "clocks": len(clocks),
        "max_mhz": clocks[0],
        "min_mhz": clocks[-1],
    }
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    e0, t0 = gpu.energy_mj(), time.perf_counter()
    for _ in range(200):
        a @ a
    torch.cuda.synchronize()
    e1, t1 = gpu.energy_mj(), time.perf_counter()
    out["matmul_seconds"] = t1 - t0
    out["matmul_joules"] = (e1 - e0) / 1000.0
    out["matmul_avg_watts"] = (e1 - e0) / 1000.0 / (t1 - t0)
    out["matmul_tflops"] = 200 * 2 * 8192**3 / (t1 - t0) / 1e12
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    picks = [clocks[0], clocks[len(clocks) // 2], clocks[-1]]
    client.use_plan(
        Plan(1, tuple(PlanStep(k, m, picks[i % 3], 0) for i, (k, m) in enumerate(order)))
    )
    b = torch.randn(2048, 2048, device="cuda")
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        with client.iteration():
            for k, m in order:
                t = clock()
                with client.instruction(k, microbatch=m):
                    b @ b
                samples.append((clock() - t) / 1000.0)
    torch.cuda.synchronize()
    client.controller.flush()
    out["hooked_matmul_instruction_median_us"] = statistics.median(samples)
    out["hooked_matmul_instruction_p99_us"] = pct(samples, 0.99)
    out["dry_run_requests"] = len(gpu.requests)
    out["requests_match_plan"] = [f for _, f in gpu.requests[:3]] == picks
    client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nvml", action="store_true", help="read-only check on a real NVIDIA GPU")
    args = ap.parse_args(argv)
    order = one_f_one_b(args.microbatches)
    if args.nvml:
        print(json.dumps(nvml_check(args.iterations, order), indent=2))
        return 0
    # warm up (imports, caches)
    bench_client(order, 5, [1410, 1200, 1000])
    empty = bench_empty(order, args.iterations)
    base = statistics.median(empty)
    rows: list[dict[str, Any]] = [
        {"case": "empty loop", "median_us": base, "p99_us": pct(empty, 0.99), "overhead_us": 0.0}
    ]
    for name, clocks in (
        ("clock changes every instruction", [1410, 1200, 1000]),
        ("one clock (no-op requests)", [1200]),
    ):
        s, b = bench_client(order, args.iterations, clocks)
        med = statistics.median(s)
        rows.append(
            {
                "case": name,
                "median_us": med,
                "p99_us": pct(s, 0.99),
                "overhead_us": med - base,
                "iteration_boundary_median_us": statistics.median(b),
            }
        )
    if args.json:
        print(
            json.dumps(
                {
                    "instructions_per_iteration": len(order),
                    "iterations": args.iterations,
                    "rows": rows,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"per-instruction hook cost, SimulatedGpu(time_scale=0), {len(order)} instructions x {args.iterations} iterations"
    )
    print(
        f"{'case':34s} {'median us':>10s} {'p99 us':>10s} {'overhead us':>12s} {'iter boundary us':>17s}"
    )
    for r in rows:
        ib = r.get("iteration_boundary_median_us")
        print(
            f"{r['case']:34s} {r['median_us']:10.2f} {r['p99_us']:10.2f} {r['overhead_us']:12.2f} "
            f"{'' if ib is None else f'{ib:17.2f}'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
