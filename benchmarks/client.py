"""Per-instruction overhead of the Perseus client hooks on the training thread.

Runs a 1F1B-shaped instruction sequence through ``with client.instruction(...)`` with a
:class:`SimulatedGpu` at ``time_scale=0`` (nothing sleeps, so only the hooks' own cost is
measured) and, as the baseline, the same loop with an empty body. Each instruction is timed
individually with ``perf_counter_ns``; the table gives median and p99 in microseconds, and the
overhead (hooked minus empty, medians). Iteration-boundary cost is reported per iteration.

Cases: a plan whose clock changes at every instruction (a controller request per instruction)
and a plan with one clock (every request after the first is a skipped no-op), both with the
client's applied-clock sampler at its default interval (50 ms; its thread, not the training
thread, reads the clock); then the same clock-changing plan without the sampler and with a
sampler every 1 ms (what the sampler thread costs the training thread through the GIL), and the
cost of one sample on the sampler thread (``ClockSampler.sample``, SimulatedGpu).

    .venv/bin/python benchmarks/client.py [--iterations 300] [--microbatches 8] [--json]
    .venv/bin/python benchmarks/client.py --smoke   # a few iterations of every case (the suite's)

``--gpud`` measures the node daemon (as root; it starts ``perseus gpud --simulate 1`` on a
temporary socket): the clock-change latency through the daemon (``DaemonGpu.set_locked_clocks``
issued until the daemon answers that the lock is applied, p50/p99) against the in-process backend
(``NvmlGpu`` over the same NVML stand-in), the time from a holder's SIGKILL to the reset (polling
``status``), and the training-thread cost per instruction with ``DaemonGpu`` (clock changes at
every instruction; the round trips run on the controller thread).

``--nvml`` is the read-only GPU check (needs an NVIDIA GPU; never changes a clock): it lists the
supported SM clocks through :class:`NvmlGpu`, reads the energy counter around a bf16 matmul
workload, and measures the hooks with ``NvmlGpu(dry_run=True)`` and CUDA events (torch); it
also runs the CUDA-event transfer check (``--events`` alone: a P2P-like copy on a side stream
timed by the integrations' event timer, event time against the CPU wait and a synchronised
reference; without CUDA it prints a line saying it was skipped and ``"cuda": false``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from perseus_client import PerseusClient, Reporting, SimulatedGpu
from perseus_client.measurements import EventTiming
from perseus_common.wire.values import PlanStep, PlanUpdate

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
    order: list[tuple[str, int]], iterations: int, clocks: list[int], sample_interval: float = 0.05
) -> tuple[list[float], list[float]]:
    gpu = SimulatedGpu(PROFILE, time_scale=0.0)
    client = PerseusClient(
        offline=True,
        gpu=gpu,
        handle_signals=False,
        reporting=Reporting(clock_sample_interval=sample_interval),
    )
    steps = tuple(PlanStep(k, m, clocks[i % len(clocks)], 0) for i, (k, m) in enumerate(order))
    client.use_plan(PlanUpdate(1, steps))
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


def bench_sample(repeats: int) -> list[float]:
    """Microseconds of one applied-clock sample (on the sampler's thread) during an instruction."""
    from perseus_client.gpu.applied import ClockSampler, fixed_lock

    gpu = SimulatedGpu(PROFILE, time_scale=0.0)
    gpu.set_locked_clocks(1410)
    gpu.throttle(1000)  # every sample off-plan: the costlier path
    # The sampler reads the controller's lock as a LockState snapshot (a settled lock at 1410).
    sampler = ClockSampler(gpu, fixed_lock(1410), interval=3600.0)
    gpu.begin_instruction("forward", 0, 0)
    clock = time.perf_counter_ns
    out = []
    recorded = 0
    for _ in range(repeats):
        t0 = clock()
        recorded += sampler.sample()
        out.append((clock() - t0) / 1000.0)
    sampler.close()
    if recorded != repeats:
        raise RuntimeError(f"the sampler recorded {recorded} of {repeats} samples")
    return out


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
        PlanUpdate(1, tuple(PlanStep(k, m, picks[i % 3], 0) for i, (k, m) in enumerate(order)))
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


def _latencies(fn: Any, values: list[int], repeats: int) -> list[float]:
    out = []
    clock = time.perf_counter_ns
    for i in range(repeats):
        t0 = clock()
        fn(values[i % len(values)])
        out.append((clock() - t0) / 1000.0)
    return out


def gpud_check(
    iterations: int, order: list[tuple[str, int]], repeats: int = 2000
) -> dict[str, Any]:
    """The node daemon's latencies (see the module docstring); needs root."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from perseus_client import DaemonGpu, NvmlGpu
    from perseus_client.errors import GpudUnavailableError
    from perseus_client.gpu.daemon_connection import GpudConnection
    from perseus_common.proto import gpud_pb2
    from perseus_gpud.simnvml import SimulatedNvml

    clocks = [1410, 1200, 1005]
    tmp = Path(tempfile.mkdtemp(prefix="perseus-gpud-bench-"))
    sock = str(tmp / "gpud.sock")
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perseus_gpud",
            "--socket",
            sock,
            "--simulate",
            "1",
            "--ownership",  # latency only: the holders here open no (simulated) device node
            "none",
            "--log-level",
            "WARNING",
        ],
    )
    out: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                GpudConnection(sock).close()
                break
            except GpudUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        inproc = NvmlGpu(0, nvml=SimulatedNvml(1))
        local = _latencies(inproc.set_locked_clocks, clocks, repeats)
        gpu = DaemonGpu(0, socket=sock)
        remote = _latencies(gpu.set_locked_clocks, clocks, repeats)
        out["clock_change_in_process_p50_us"] = statistics.median(local)
        out["clock_change_in_process_p99_us"] = pct(local, 0.99)
        out["clock_change_daemon_p50_us"] = statistics.median(remote)
        out["clock_change_daemon_p99_us"] = pct(remote, 0.99)

        client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
        steps = tuple(PlanStep(k, m, clocks[i % 3], 0) for i, (k, m) in enumerate(order))
        client.use_plan(PlanUpdate(1, steps))
        samples: list[float] = []
        clock = time.perf_counter_ns
        for _ in range(iterations):
            with client.iteration():
                for k, m in order:
                    t0 = clock()
                    with client.instruction(k, microbatch=m):
                        pass
                    samples.append((clock() - t0) / 1000.0)
        client.close()
        gpu.close()
        out["daemon_instruction_median_us"] = statistics.median(samples)
        out["daemon_instruction_p99_us"] = pct(samples, 0.99)

        holder_code = (
            "import sys, time\n"
            "from perseus_client import DaemonGpu\n"
            "g = DaemonGpu(0, socket=sys.argv[1]); g.set_locked_clocks(1005)\n"
            "print('locked', flush=True); time.sleep(60)\n"
        )
        kills: list[float] = []
        with GpudConnection(sock) as conn:
            for _ in range(5):
                holder = subprocess.Popen(
                    [sys.executable, "-c", holder_code, sock], stdout=subprocess.PIPE, text=True
                )
                assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
                t0 = time.perf_counter()
                os.kill(holder.pid, signal.SIGKILL)
                while True:
                    g = conn.call(status=gpud_pb2.Empty()).status.gpus[0]
                    if not g.HasField("holder") and not g.HasField("locked_mhz"):
                        break
                    time.sleep(0.0005)
                kills.append((time.perf_counter() - t0) * 1000.0)
                holder.wait()
        out["sigkill_to_reset_median_ms"] = statistics.median(kills)
        out["sigkill_to_reset_max_ms"] = max(kills)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
    return out


def event_check(repeats: int, megabytes: int = 1024) -> dict[str, Any]:
    """A P2P-like copy on a side stream timed by the client's CUDA-event transfer timer.

    As NCCL runs a P2P op: the side stream waits for the work already queued on the current
    stream (a matmul, the producer), copies ``megabytes`` device to device, and the "wait"
    makes the current stream wait for the side stream and returns at once. Around it, the
    integrations' timer (``event_factory(mode="events")``): one event recorded on the current
    stream before the op is posted, one after the wait, handed to ``record_transfer`` as an
    :class:`EventTiming` and resolved when the report is (off the training thread). Printed:
    the event-measured time, the CPU time from posting to the end of the wait (what CPU timing
    would record: nearly nothing), and the copy alone timed on the CPU over ten copies with
    ``synchronize`` (the reference).
    Without CUDA: ``{"cuda": false, "skipped": ...}``.
    """
    try:
        import torch
    except ImportError:
        return {"cuda": False, "skipped": "torch is not installed: CUDA-event timing not checked"}
    if not torch.cuda.is_available():
        return {"cuda": False, "skipped": "no CUDA device: CUDA-event timing not checked"}
    from perseus_client.integrations._timing import event_factory

    make = event_factory(None, "events")
    assert make is not None
    n = megabytes * 2**20 // 4
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    gpu = SimulatedGpu(PROFILE, time_scale=0.0)
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    cpu_wait: list[float] = []
    reference: list[float] = []
    events: list[float] = []
    for _ in range(repeats):
        torch.cuda.synchronize()  # the reference: 10 copies alone, synchronised, per copy
        t0 = time.perf_counter()
        for _ in range(10):
            dst.copy_(src)
        torch.cuda.synchronize()
        reference.append((time.perf_counter() - t0) / 10)
        with client.iteration():
            a @ a  # the producer, queued before the transfer
            start = make()
            t0 = time.perf_counter()
            start.record()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                dst.copy_(src)
            torch.cuda.current_stream().wait_stream(side)  # the op's wait: returns at once
            end = make()
            end.record()
            cpu_wait.append(time.perf_counter() - t0)
            client.record_transfer(0, "forward", 0, EventTiming(start, end))
        report = client.last_report
        assert report is not None
        events.extend(float(t[3]) for t in report.resolved().transfers)
    client.close()
    med_ev, med_ref = statistics.median(events), statistics.median(reference)
    return {
        "cuda": True,
        "device": torch.cuda.get_device_name(),
        "copy_megabytes": megabytes,
        "repeats": repeats,
        "event_ms_median": 1e3 * med_ev,
        "cpu_wait_ms_median": 1e3 * statistics.median(cpu_wait),
        "reference_ms_median": 1e3 * med_ref,
        "event_vs_reference": med_ev / med_ref,
        "within_10_percent": abs(med_ev / med_ref - 1) <= 0.10,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--smoke", action="store_true", help="a few iterations of every case (figures meaningless)"
    )
    ap.add_argument("--nvml", action="store_true", help="read-only check on a real NVIDIA GPU")
    ap.add_argument("--gpud", action="store_true", help="latencies through the node daemon (root)")
    ap.add_argument(
        "--events",
        action="store_true",
        help="only the CUDA-event transfer check (part of --nvml; skips with a line without CUDA)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.iterations = min(args.iterations, 3)
    order = one_f_one_b(args.microbatches)
    if args.gpud:
        print(json.dumps(gpud_check(args.iterations, order), indent=2))
        return 0
    if args.events or args.nvml:
        ev = event_check(3 if args.smoke else 20)
        if not ev["cuda"]:
            print(f"CUDA-event transfer check skipped: {ev['skipped']}", file=sys.stderr)
        if args.events:
            print(json.dumps(ev, indent=2))
            return 0
        res = nvml_check(args.iterations, order)
        res["transfer_events"] = ev
        print(json.dumps(res, indent=2))
        return 0
    # warm up (imports, caches)
    bench_client(order, 5, [1410, 1200, 1000])
    empty = bench_empty(order, args.iterations)
    base = statistics.median(empty)
    rows: list[dict[str, Any]] = [
        {"case": "empty loop", "median_us": base, "p99_us": pct(empty, 0.99), "overhead_us": 0.0}
    ]
    for name, clocks, interval in (
        ("clock changes every instruction", [1410, 1200, 1000], 0.05),
        ("one clock (no-op requests)", [1200], 0.05),
        ("clock changes, no clock sampler", [1410, 1200, 1000], 0.0),
        ("clock changes, sampler every 1 ms", [1410, 1200, 1000], 0.001),
    ):
        s, b = bench_client(order, args.iterations, clocks, interval)
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
    one = bench_sample(50 if args.smoke else max(1000, args.iterations * 10))
    rows.append(
        {
            "case": "one clock sample (sampler thread)",
            "median_us": statistics.median(one),
            "p99_us": pct(one, 0.99),
            "overhead_us": 0.0,
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
