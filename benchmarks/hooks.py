"""Cost of the torch.distributed.pipelining hooks on a real pipeline, and the clocks they request.

One process (a 1-rank gloo group) runs a ``ScheduleInterleaved1F1B`` pipeline holding 2 model
stages on one device, with and without the Perseus hooks and an offline ``PerseusClient`` whose
plan alternates clocks at every instruction. Reported:

* the step time with and without hooks (median over iterations) and the difference per instruction;
* the time spent inside the hooks per instruction (median and p99, µs): each stage method timed
  with and without its wrapper;
* the recorded clock requests against the plan (they must match).

Backends: on a machine with CUDA, the model runs on ``cuda:0`` and the client drives
``NvmlGpu(0, dry_run=True)`` (clock requests are recorded, never applied); elsewhere a
``SimulatedGpu`` that never sleeps.

    .venv/bin/python benchmarks/hooks.py [--iterations 50] [--microbatches 8] [--width 256] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B  # noqa: E402

from perseus_client import PerseusClient, Plan, PlanStep, RecordingGpu, SimulatedGpu  # noqa: E402
from perseus_client.integrations import torch_pipelining  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def build(device: torch.device, width: int, microbatches: int) -> Any:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(2)]
    stages = [PipelineStage(layers[i].to(device), i, 2, device) for i in range(2)]
    return ScheduleInterleaved1F1B(stages, microbatches, loss_fn=lambda o, t: ((o - t) ** 2).mean())


def make_gpu(cuda: bool) -> Any:
    if cuda:
        from perseus_client import NvmlGpu

        return RecordingGpu(NvmlGpu(0, dry_run=True))
    curve = {1410: (0.001, 0.3), 1200: (0.0012, 0.26), 1005: (0.0015, 0.24)}
    data = {(s, k): dict(curve) for s in (0, 1) for k in ("forward", "backward")}
    return RecordingGpu(SimulatedGpu(data, time_scale=0.0))


def run(
    schedule: Any, device: torch.device, width: int, batch: int, iterations: int
) -> list[float]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, width, generator=gen).to(device)
    y = torch.randn(batch, width, generator=gen).to(device)
    times = []
    for _ in range(iterations):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        schedule.step(x, target=y)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def time_methods(schedule: Any, samples: list[float]) -> None:
    """Wrap the (possibly hooked) stage methods with a timer that appends µs to ``samples``."""
    for stage in torch_pipelining.schedule_stages(schedule):
        for name in ("forward_one_chunk", "backward_one_chunk"):
            inner = getattr(stage, name)

            def timed(*a: Any, _inner: Any = inner, **k: Any) -> Any:
                t0 = time.perf_counter_ns()
                try:
                    return _inner(*a, **k)
                finally:
                    samples.append((time.perf_counter_ns() - t0) / 1000.0)

            setattr(stage, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda:0" if cuda else "cpu")
    batch = 4 * args.microbatches
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        plain = build(device, args.width, args.microbatches)
        hooked = build(device, args.width, args.microbatches)
        order = torch_pipelining.export_orders(hooked)[0]
        gpu = make_gpu(cuda)
        clocks = list(gpu.supported_clocks())[:3]
        steps = tuple(
            PlanStep(k, m, clocks[i % len(clocks)], s) for i, (k, m, s) in enumerate(order)
        )
        plain_inner: list[float] = []
        hooked_inner: list[float] = []
        plain_times: list[float] = []
        hooked_times: list[float] = []
        with PerseusClient(offline=True, gpu=gpu, handle_signals=False) as client:
            client.use_plan(Plan(1, steps))
            with torch_pipelining.instrument(hooked, client):
                run(plain, device, args.width, batch, 3)  # warm-up
                run(hooked, device, args.width, batch, 3)
                time_methods(plain, plain_inner)
                time_methods(hooked, hooked_inner)
                del gpu.instructions[:]
                # Alternate, so that both see the same machine load.
                for _ in range(args.iterations):
                    plain_times += run(plain, device, args.width, batch, 1)
                    hooked_times += run(hooked, device, args.width, batch, 1)
        ran = [(r.kind, r.microbatch, r.stage, r.mhz) for r in gpu.instructions]
        planned = [(s.kind, s.microbatch, s.stage, s.frequency_mhz) for s in steps]
        n = len(order)
        result = {
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "backend": type(gpu.inner).__name__ + (" (dry_run)" if cuda else ""),
            "instructions_per_iteration": n,
            "step_ms_plain_median": 1e3 * statistics.median(plain_times),
            "step_ms_hooked_median": 1e3 * statistics.median(hooked_times),
            "overhead_us_per_instruction_from_steps": 1e6
            * (statistics.median(hooked_times) - statistics.median(plain_times))
            / n,
            "instruction_us_plain_median": statistics.median(plain_inner),
            "instruction_us_hooked_median": statistics.median(hooked_inner),
            "instruction_us_hooked_p99": pct(hooked_inner, 0.99),
            "hook_us_median": statistics.median(hooked_inner) - statistics.median(plain_inner),
            "clock_requests": len(gpu.requests),
            "clocks_match_plan": ran == planned * args.iterations,
        }
    finally:
        dist.destroy_process_group()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:45s} {v:.1f}" if isinstance(v, float) else f"{k:45s} {v}")


if __name__ == "__main__":
    main()
