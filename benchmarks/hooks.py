"""What the Perseus integrations cost the training thread, per instruction, with transfer timing.

Each integration runs for real with an offline ``PerseusClient`` on a recording ``SimulatedGpu``
that never sleeps (``time_scale=0``), whose plan changes the clock at every instruction:

* ``torch``: ``torch.distributed.pipelining``, ``ScheduleInterleaved1F1B`` on 2 gloo ranks (4
  model stages, every boundary between ranks, so every transfer is a real P2P op);
* ``deepspeed``: a DeepSpeed ``PipelineEngine`` (``TrainSchedule``) on 2 gloo ranks (CPU
  accelerator);
* ``megatron``: Megatron-core's real ``forward_step`` / ``backward_step`` called through the
  schedules module in 1F1B order, as its schedules call them (its pipelined schedules need CUDA,
  so no P2P runs here and its transfer hooks are not exercised).

How the hooks' cost is measured: every function the hooks wrap (the instruction methods, the P2P
functions, the iteration) is timed twice, once inside the hook (around the original) and once
outside it, with ``perf_counter_ns``; outside minus inside is the hook's own time for that call.
A P2P hook's time is added to the next instruction's, so "per instruction" covers everything the
hooks do on the training thread but the iteration boundary, reported on its own. Rank 0's
figures; medians and p99 over every instruction of the measured iterations. Also reported: the
transfers recorded per iteration and whether the clocks the GPU saw were the plan's.

What training feels, the step time, comes from a second, paired phase in the same processes,
with every timer passing straight through: ``--pairs`` pairs of one unhooked and one hooked step
(the same model built twice; Megatron: the hooks switched off and on), which of the two runs
first drawn at random (a seed both ranks share). Each pair's difference divided by the rank's
instructions per iteration is the hooks' excess per instruction as the step sees it (both ranks'
hooks, as they sit on the critical path); reported: its median with the sign test's 95 %
interval (distribution-free), and the plain and hooked steps' medians of the same pairs. Two
steps a few ms apart see nearly the same machine load, so their difference is not the load's.

    .venv/bin/python benchmarks/hooks.py [--integration torch|deepspeed|megatron ...]
        [--iterations 40] [--pairs 400] [--microbatches 8] [--json]
    .venv/bin/python benchmarks/hooks.py --smoke   # 3 iterations, 4 pairs of each (the suite's)
    .venv/bin/python benchmarks/hooks.py --events  # the CUDA-event transfer check (GPU machine)

``--events`` (and ``--transfer-timing events``, which needs CUDA too) first runs
``benchmarks/client.py``'s CUDA-event transfer check: a P2P-like copy on a side stream timed by the
integrations' event timer, its event time against the CPU wait; without CUDA it says it skipped.

Run from another tree's ``PYTHONPATH`` (e.g. ``git worktree`` of an older commit) it measures that
tree's hooks: the timers wrap whatever the hooks wrap, and are neutral where a hook is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

HERE = Path(__file__).resolve().parent
INTEGRATIONS = ("torch", "deepspeed", "megatron")
WORLD = 2
ns = time.perf_counter_ns
cpu = time.thread_time_ns
INSIDE: set[Any] = set()  # the inside timers (a hook's functools.wraps copies attributes)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


class Meter:
    """Inside/outside timers (wall and this thread's CPU time, ns).

    ``instr``: the hooks' time per instruction, the P2P hooks' carried into the next
    instruction; ``floor``: the same pair of timers around an unhooked call (the plain run's
    instructions): what the timers themselves add, subtracted from the medians.
    """

    def __init__(self) -> None:
        self.inner = (0, 0)
        self.carry = (0, 0, 0)  # wall, cpu, timed calls
        self.on = False
        self.plain = False
        self.instr: list[tuple[int, int, int]] = []
        self.floor: list[tuple[int, int]] = []
        self.p2p: list[tuple[int, int]] = []
        self.step: list[int] = []
        self.step_inner = 0
        #: The paired phase: every timer passes straight through (the step times must not
        #: carry the timers' own cost, which the hooked run would pay on more calls).
        self.bypass = False

    def inside(self, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            if self.bypass:
                return fn(*a, **k)
            t0, c0 = ns(), cpu()
            try:
                return fn(*a, **k)
            finally:
                c1 = cpu()
                self.inner = (ns() - t0, c1 - c0)

        INSIDE.add(timed)
        return timed

    def outside(self, fn: Any, what: str) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            if self.bypass:
                return fn(*a, **k)
            self.inner = (0, 0)
            t0, c0 = ns(), cpu()
            try:
                return fn(*a, **k)
            finally:
                c1 = cpu()
                d = (ns() - t0 - self.inner[0], c1 - c0 - self.inner[1])
                if self.plain:
                    if what == "instr":
                        self.floor.append(d)
                elif self.on:
                    c = self.carry
                    if what == "instr":
                        self.instr.append((d[0] + c[0], d[1] + c[1], c[2] + 1))
                        self.carry = (0, 0, 0)
                    else:
                        self.p2p.append(d)
                        self.carry = (c[0] + d[0], c[1] + d[1], c[2] + 1)

        return timed

    def step_inside(self, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            if self.bypass:
                return fn(*a, **k)
            t0 = ns()
            try:
                return fn(*a, **k)
            finally:
                self.step_inner = ns() - t0

        return timed

    def step_outside(self, fn: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            if self.bypass:
                return fn(*a, **k)
            t0 = ns()
            try:
                return fn(*a, **k)
            finally:
                if self.on:
                    self.step.append(ns() - t0 - self.step_inner)

        return timed


def hooked_by(fn: Any) -> bool:
    """Whether the hooks replaced ``fn`` (an inside timer).

    A function they left alone gets no outside timer, so an older tree without transfer hooks is
    not charged the timers' cost.
    """
    return fn not in INSIDE


def simulated(stages: list[int]) -> Any:
    """The rank's GPU: a ``SimulatedGpu``, or one that costs what a real GPU's backend does.

    ``--gpu simulated`` gives the ``SimulatedGpu``; ``--gpu async`` one that costs the training
    thread what a real GPU's backend does (see :func:`async_gpu`).
    """
    from perseus_client import SimulatedGpu

    curve = {1410: (0.001, 0.3), 1200: (0.0012, 0.26), 1005: (0.0015, 0.24)}
    kinds = ("forward", "backward", "backward_input", "backward_weight")
    curves = {(s, k): dict(curve) for s in stages for k in kinds}
    if GPU[0] == "async":
        return async_gpu(curves)
    return SimulatedGpu(curves, time_scale=0.0)


def async_gpu(curves: dict[Any, Any]) -> Any:
    """A ``SimulatedGpu`` that costs the training thread what ``NvmlGpu`` and ``DaemonGpu`` do.

    Its clock locks are asynchronous (``synchronous_clocks = False``: the client's controller
    thread applies them, as it does NVML's and the daemon's), its ``begin_instruction`` /
    ``end_instruction`` only note the running instruction (``GpuBackend``'s own, what the real
    backends use) instead of the simulator's per-instruction time and energy model, and its
    timestamps are the wall clock.
    """
    from perseus_client import SimulatedGpu
    from perseus_client.gpu.base import GpuBackend

    class AsyncGpu(SimulatedGpu):
        synchronous_clocks = False
        begin_instruction = GpuBackend.begin_instruction
        end_instruction = GpuBackend.end_instruction
        abort_instruction = GpuBackend.abort_instruction
        timestamp = GpuBackend.timestamp

    return AsyncGpu(curves, time_scale=0.0)


def changing_plan(order: list[list[Any]], gpu: Any) -> Any:
    from perseus_common.wire.values import PlanStep, PlanUpdate

    clocks = list(gpu.supported_clocks())[:3]
    return PlanUpdate(
        1, tuple(PlanStep(k, m, clocks[i % 3], s) for i, (k, m, s) in enumerate(order))
    )


class NullClient:
    """A client whose calls do nothing (``--client null``).

    What the integration's own wrappers cost, without the client core's clock requests and
    measurements.
    """

    last_report = None

    def __init__(self) -> None:
        self._cm = contextlib.nullcontext()

    def iteration(self) -> Any:
        return self._cm

    def instruction(self, kind: str, *, microbatch: int, stage: int) -> Any:
        return self._cm

    def record_transfer(
        self, boundary: int, direction: str, microbatch: int, seconds: float
    ) -> None:
        pass

    def use_plan(self, plan: Any) -> None:
        pass

    def __enter__(self) -> NullClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


CLIENT = ["perseus"]  # or "null" (set by --client)
PAIRS = [400]  # --pairs: plain/hooked step pairs of the paired phase
TRANSFERS = [True]  # --no-transfers: instrument(..., transfers=False)
TIMING = ["auto"]  # --transfer-timing: instrument(..., transfer_timing=...)
GPU = ["simulated"]  # --gpu: the rank's GPU backend (see simulated())


def instrument_kwargs() -> dict[str, Any]:
    kw: dict[str, Any] = {} if TRANSFERS[0] else {"transfers": False}
    if TIMING[0] != "auto":
        kw["transfer_timing"] = TIMING[0]
    return kw


def median_ci(xs: list[float], level: float = 0.95) -> tuple[float, float]:
    """The distribution-free interval of the median (the sign test's).

    Order statistics ``k`` and ``n + 1 - k`` for the largest ``k`` with ``P(Binomial(n, 1/2) <
    k) <= (1 - level) / 2`` (coverage at least ``level``; with too few values, the smallest and
    the largest).
    """
    s = sorted(xs)
    n = len(s)
    if not n:
        return float("nan"), float("nan")
    k, cdf = 1, 0.0
    for j in range(n):
        cdf += math.comb(n, j) / 2**n
        if cdf > (1 - level) / 2:
            break
        k = j + 1
    k = min(k, (n + 1) // 2)
    return s[k - 1], s[n - k]


def paired(
    meter: Meter, plain: Any, hooked: Any, check: Any
) -> tuple[list[float], list[float], bool]:
    """The paired phase: ``PAIRS`` pairs of one plain and one hooked step, the timers off.

    The steps are callables returning seconds, run in the same processes, one right after the
    other, which first drawn at random with a seed every rank shares (their steps exchange data:
    both must run the same one). ``check()``: whether the hooked step just run ran the plan's
    clocks.
    """
    rng = random.Random(20261202)
    meter.bypass = True
    p_t: list[float] = []
    h_t: list[float] = []
    ok = True
    try:
        for _ in range(PAIRS[0]):
            if rng.random() < 0.5:
                h_t.append(hooked())
                ok = check() and ok
                p_t.append(plain())
            else:
                p_t.append(plain())
                h_t.append(hooked())
                ok = check() and ok
    finally:
        meter.bypass = False
    return p_t, h_t, ok


def client_for(gpu: Any) -> Any:
    from perseus_client import PerseusClient

    if CLIENT[0] == "null":
        return NullClient()
    return PerseusClient(offline=True, gpu=gpu, handle_signals=False)


def counting(client: Any) -> list[int]:
    """Transfers recorded per iteration (the last entry: the iteration running).

    The real client's are counted from its report afterwards (:func:`note_transfers`): a wrapper
    around its ``record_transfer`` would run on the hooks' path and be charged to them. The null
    client, which reports nothing, is wrapped.
    """
    counts = [0]
    inner = getattr(client, "record_transfer", None)
    if inner is None or CLIENT[0] != "null":
        return counts

    def record(*a: Any) -> None:
        counts[-1] += 1
        inner(*a)

    client.record_transfer = record
    return counts


def note_transfers(client: Any, counts: list[int]) -> None:
    """After a hooked iteration: its transfers, from the real client's report."""
    report = getattr(client, "last_report", None)
    if report is not None:
        counts[-1] = len(report.transfers)


def ran_plan(client: Any, plan: Any) -> bool:
    """Whether the iteration just run requested the plan's clock for each instruction."""
    report = client.last_report
    if report is None:  # the null client
        return True
    ran = [(i.kind, i.microbatch, i.stage, i.frequency_mhz) for i in report.instructions]
    return ran == [(s.instruction, s.microbatch, s.stage, s.frequency_mhz) for s in plan.steps]


def summary(
    meter: Meter,
    plain: list[float],
    hooked: list[float],
    n: int,
    iterations: int,
    transfers: list[int],
    clocks_ok: bool,
) -> dict[str, Any]:
    def us(xs: list[int]) -> list[float]:
        return [x / 1000 for x in xs]

    # Each timed call (the instruction's and the P2P hooks' carried into it) pays the timers'
    # floor once: subtract it per call.
    floor_wall = statistics.median([d[0] for d in meter.floor]) if meter.floor else 0
    floor_cpu = statistics.median([d[1] for d in meter.floor]) if meter.floor else 0
    wall = us([d[0] - d[2] * floor_wall for d in meter.instr])
    cpu_ = us([d[1] - d[2] * floor_cpu for d in meter.instr])
    p2p = us([d[0] - floor_wall for d in meter.p2p])
    excess = [1e6 * (h - p) / n for p, h in zip(plain, hooked, strict=True)]
    lo, hi = median_ci(excess)
    return {
        "instructions_per_iteration": n,
        "iterations": iterations,
        "hook_us_median": statistics.median(wall),
        "hook_us_p99": pct(wall, 0.99),
        "hook_cpu_us_median": statistics.median(cpu_),
        "hook_cpu_us_p99": pct(cpu_, 0.99),
        "timer_floor_us": floor_wall / 1000,
        "p2p_hook_us_median": statistics.median(p2p) if p2p else 0.0,
        "p2p_hooked_calls_per_iteration": len(meter.p2p) / iterations,
        "iteration_boundary_us_median": statistics.median(us(meter.step)),
        # The paired phase (timers off): what training feels.
        "pairs": len(plain),
        "step_ms_plain_median": 1e3 * statistics.median(plain) if plain else float("nan"),
        "step_ms_hooked_median": 1e3 * statistics.median(hooked),
        "step_excess_us_per_instruction_median": statistics.median(excess),
        "step_excess_us_per_instruction_ci95": [lo, hi],
        "transfers_recorded_per_iteration": statistics.median(transfers) if transfers else 0,
        "clocks_match_plan": clocks_ok if CLIENT[0] != "null" else "n/a",
    }


# -- torch.distributed.pipelining -------------------------------------------------------------


def torch_rank(rank: int, iterations: int, microbatches: int, width: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B
    from torch.distributed.pipelining import schedules as tsched

    from perseus_client.integrations import torch_pipelining

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    total, mine = 2 * WORLD, [rank, rank + WORLD]

    def build() -> Any:
        torch.manual_seed(0)
        layers = [
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
            for _ in range(total)
        ]
        stages = [PipelineStage(layers[i], i, total, torch.device("cpu")) for i in mine]
        return ScheduleInterleaved1F1B(
            stages, microbatches, loss_fn=lambda o, t: ((o - t) ** 2).mean()
        )

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4 * microbatches, width, generator=gen)
    y = torch.randn(4 * microbatches, width, generator=gen)

    def step(schedule: Any) -> float:
        t0 = time.perf_counter()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        return time.perf_counter() - t0

    plain, hooked = build(), build()
    meter = Meter()
    methods = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    p2p_methods = ("get_fwd_send_ops", "get_fwd_recv_ops", "get_bwd_send_ops", "get_bwd_recv_ops")
    stages = torch_pipelining.schedule_stages(hooked)
    for st in torch_pipelining.schedule_stages(plain):  # the timers' floor
        for name in methods:
            setattr(st, name, meter.outside(meter.inside(getattr(st, name)), "instr"))
    for st in stages:
        for name in methods + p2p_methods:
            setattr(st, name, meter.inside(getattr(st, name)))
    hooked.step = meter.step_inside(hooked.step)
    originals = {n: getattr(tsched, n) for n in ("_batch_p2p", "_wait_batch_p2p")}
    for n, fn in originals.items():
        setattr(tsched, n, meter.inside(fn))
    order = torch_pipelining.export_orders(hooked)[rank]
    gpu = simulated(mine)
    plan = changing_plan(order, gpu)
    clocks_ok = True
    try:
        with client_for(gpu) as client:
            client.use_plan(plan)
            transfers = counting(client)
            with torch_pipelining.instrument(hooked, client, **instrument_kwargs()):
                for st in stages:
                    for name in methods:
                        setattr(st, name, meter.outside(getattr(st, name), "instr"))
                    for name in p2p_methods:
                        if hooked_by(getattr(st, name)):
                            setattr(st, name, meter.outside(getattr(st, name), "p2p"))
                hooked.step = meter.step_outside(hooked.step)
                for n in originals:
                    if hooked_by(getattr(tsched, n)):
                        setattr(tsched, n, meter.outside(getattr(tsched, n), "p2p"))
                for _ in range(2):  # warm-up (shape inference, first sends)
                    step(plain)
                    step(hooked)
                transfers[:] = [0]
                for _ in range(iterations):  # the timed calls; alternate: the same load
                    meter.plain = True
                    step(plain)
                    meter.plain, meter.on = False, True
                    step(hooked)
                    meter.on = False
                    clocks_ok = clocks_ok and ran_plan(client, plan)
                    note_transfers(client, transfers)
                    transfers.append(0)
                counts = transfers[:-1]
                plain_t, hooked_t, ok = paired(
                    meter, lambda: step(plain), lambda: step(hooked), lambda: ran_plan(client, plan)
                )
                clocks_ok = clocks_ok and ok
    finally:
        for n, fn in originals.items():
            setattr(tsched, n, fn)
        dist.destroy_process_group()
    return summary(meter, plain_t, hooked_t, len(order), iterations, counts, clocks_ok)


# -- DeepSpeed -------------------------------------------------------------------------------


def deepspeed_rank(rank: int, iterations: int, microbatches: int, width: int) -> dict[str, Any]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    os.environ.update(LOCAL_WORLD_SIZE=str(WORLD))
    import torch

    from perseus_client.integrations import _base
    from perseus_client.integrations import deepspeed as perseus_ds

    with _base.stdout_to_stderr():
        import deepspeed
        import deepspeed.ops
        import torch.distributed as dist
        from deepspeed.pipe import PipelineModule
        from deepspeed.runtime.pipe.engine import PipelineEngine

        # Pipelining never uses the shared-memory allreduce kernel the CPU accelerator would
        # JIT-compile first (minutes on two cores); gloo is used.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    meter = Meter()
    # Inside timers on the class's map, before the hooks copy it.
    PipelineEngine._INSTRUCTION_MAP = {
        k: meter.inside(v) for k, v in PipelineEngine._INSTRUCTION_MAP.items()
    }

    def build() -> Any:
        torch.manual_seed(1234)
        layers = [torch.nn.Linear(width, width) for _ in range(2 * WORLD)]
        module = PipelineModule(
            layers=layers, num_stages=WORLD, loss_fn=torch.nn.MSELoss(), partition_method="uniform"
        )
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": microbatches,
            "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
            "steps_per_print": 10**9,
        }
        with _base.stdout_to_stderr():
            engine, _, _, _ = deepspeed.initialize(
                model=module, model_parameters=list(module.parameters()), config=config
            )
        return engine

    gen = torch.Generator().manual_seed(9)
    data = [
        (torch.randn(2, width, generator=gen), torch.randn(2, width, generator=gen))
        for _ in range(microbatches)
    ]

    def step(engine: Any) -> float:
        t0 = time.perf_counter()
        engine.train_batch(iter(data))
        return time.perf_counter() - t0

    plain, hooked = build(), build()
    order = perseus_ds.export_orders(hooked.micro_batches, hooked.num_stages)[hooked.stage_id]
    gpu = simulated([hooked.stage_id])
    plan = changing_plan(order, gpu)
    # On the class: the hooks refuse an engine whose train_batch is already wrapped.
    PipelineEngine.train_batch = meter.step_inside(PipelineEngine.train_batch)
    from deepspeed.runtime.pipe import schedule as ds_schedule

    instr = (ds_schedule.ForwardPass, ds_schedule.BackwardPass)
    p2p = (
        ds_schedule.SendActivation,
        ds_schedule.RecvActivation,
        ds_schedule.SendGrad,
        ds_schedule.RecvGrad,
    )
    plain._INSTRUCTION_MAP = dict(PipelineEngine._INSTRUCTION_MAP)  # the timers' floor
    for k in instr:
        plain._INSTRUCTION_MAP[k] = meter.outside(plain._INSTRUCTION_MAP[k], "instr")
    clocks_ok = True
    try:
        with client_for(gpu) as client:
            client.use_plan(plan)
            transfers = counting(client)
            perseus_ds.instrument(hooked, client, **instrument_kwargs())
            table = hooked._INSTRUCTION_MAP
            for k in instr:
                table[k] = meter.outside(table[k], "instr")
            for k in p2p:
                if hooked_by(table[k]):
                    table[k] = meter.outside(table[k], "p2p")
            hooked.train_batch = meter.step_outside(hooked.train_batch)
            for _ in range(2):
                step(plain)
                step(hooked)
            transfers[:] = [0]
            for _ in range(iterations):
                meter.plain = True
                step(plain)
                meter.plain, meter.on = False, True
                step(hooked)
                meter.on = False
                clocks_ok = clocks_ok and ran_plan(client, plan)
                note_transfers(client, transfers)
                transfers.append(0)
            counts = transfers[:-1]
            plain_t, hooked_t, ok = paired(
                meter, lambda: step(plain), lambda: step(hooked), lambda: ran_plan(client, plan)
            )
            clocks_ok = clocks_ok and ok
    finally:
        dist.destroy_process_group()
    return summary(meter, plain_t, hooked_t, len(order), iterations, counts, clocks_ok)


# -- Megatron-core ---------------------------------------------------------------------------


def megatron_run(iterations: int, microbatches: int, width: int) -> dict[str, Any]:
    import torch

    from perseus_client.integrations import _base
    from perseus_client.integrations import megatron as perseus_megatron

    with _base.stdout_to_stderr():
        from megatron.core import ModelParallelConfig
        from megatron.core.enums import ModelType
        from megatron.core.pipeline_parallel import schedules

    torch.set_num_threads(1)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(width, width)
            self.config = ModelParallelConfig()
            self.model_type = ModelType.encoder_or_decoder

        def set_input_tensor(self, tensor: Any) -> None:
            pass

        def forward(self, x: Any) -> Any:
            return self.lin(x)

    def step_func(data: Any, model: Any) -> Any:
        x, y = next(data)
        out = model(x)
        return out, lambda o: (((o - y) ** 2).mean(), {})

    model = Model()
    gen = torch.Generator().manual_seed(3)
    batches = [
        (torch.randn(4, width, generator=gen), torch.randn(4, width, generator=gen))
        for _ in range(microbatches)
    ]
    order = perseus_megatron.export_orders(microbatches, 1)[0]

    def forward_backward(**_: Any) -> None:
        # forward_backward_no_pipelining's calls (its own needs CUDA), by module attribute.
        data = iter(batches)
        for i in range(microbatches):
            out, _ = schedules.forward_step(
                step_func,
                data,
                model,
                microbatches,
                None,
                [],
                model.config,
                1,
                False,
                is_first_microbatch=i == 0,
                current_microbatch=i,
            )
            schedules.backward_step(None, out, None, model.model_type, model.config)

    def step(fn: Any) -> float:
        t0 = time.perf_counter()
        fn(forward_only=False)
        return time.perf_counter() - t0

    meter = Meter()
    originals = {n: getattr(schedules, n) for n in ("forward_step", "backward_step")}
    for n, fn in originals.items():
        setattr(schedules, n, meter.inside(fn))
    gpu = simulated([0])
    plan = changing_plan(order, gpu)
    clocks_ok = True
    try:
        with client_for(gpu) as client:
            client.use_plan(plan)
            transfers = counting(client)
            hooks = perseus_megatron.instrument(client, order, **instrument_kwargs())
            hooked_fb = meter.step_outside(hooks.wrap(meter.step_inside(forward_backward)))
            for n in originals:
                setattr(schedules, n, meter.outside(getattr(schedules, n), "instr"))
            for _ in range(2):
                step(hooked_fb)
            transfers[:] = [0]
            for _ in range(iterations):
                # The plain run: the same calls, the hooks passing through (their floor).
                hooks._active = False
                meter.plain = True
                step(forward_backward)
                hooks._active = True
                meter.plain, meter.on = False, True
                step(hooked_fb)
                meter.on = False
                clocks_ok = clocks_ok and ran_plan(client, plan)
                note_transfers(client, transfers)
                transfers.append(0)
            counts = transfers[:-1]

            def run_plain() -> float:
                hooks._active = False
                try:
                    return step(forward_backward)
                finally:
                    hooks._active = True

            plain_t, hooked_t, ok = paired(
                meter, run_plain, lambda: step(hooked_fb), lambda: ran_plan(client, plan)
            )
            clocks_ok = clocks_ok and ok
    finally:
        for n, fn in originals.items():
            setattr(schedules, n, fn)
    return summary(meter, plain_t, hooked_t, len(order), iterations, counts, clocks_ok)


# -- driver ----------------------------------------------------------------------------------


def launch(integration: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run the integration's ranks as processes; rank 0's result."""
    if integration == "megatron":
        return megatron_run(args.iterations, args.microbatches, args.width)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
        PYTHONWARNINGS="ignore",
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        procs = []
        for r in range(WORLD):
            argv = [
                sys.executable,
                str(Path(__file__)),
                "--child",
                integration,
                "--rank",
                str(r),
                "--iterations",
                str(args.iterations),
                "--microbatches",
                str(args.microbatches),
                "--width",
                str(args.width),
                "--client",
                args.client,
                "--pairs",
                str(args.pairs),
                *(["--no-transfers"] if args.no_transfers else []),
                "--transfer-timing",
                args.transfer_timing,
                "--gpu",
                args.gpu,
                "--out",
                str(out),
            ]
            procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
            )
        errors = [p.communicate(timeout=600)[1] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(
                f"{integration}: ranks failed:\n" + "\n".join(e[-3000:] for e in errors)
            )
        return json.loads(out.read_text())


def event_check() -> dict[str, Any]:
    """``benchmarks/client.py``'s CUDA-event transfer check (see its ``event_check``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("perseus_bench_client", HERE / "client.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    result: dict[str, Any] = mod.event_check(20)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--integration", choices=INTEGRATIONS, action="append")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument(
        "--pairs", type=int, default=400, help="plain/hooked step pairs of the paired phase"
    )
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--smoke", action="store_true", help="3 iterations (4 pairs) of each, 4 microbatches"
    )
    ap.add_argument(
        "--client",
        choices=["perseus", "null"],
        default="perseus",
        help="null: a client that does nothing (the integration's wrappers alone)",
    )
    ap.add_argument("--no-transfers", action="store_true", help="transfer timing off")
    ap.add_argument(
        "--gpu",
        choices=["simulated", "async"],
        default="simulated",
        help="async: clock locks on the controller thread and no per-instruction simulator "
        "model, what a real GPU's backend costs the training thread",
    )
    ap.add_argument(
        "--transfer-timing",
        choices=["auto", "cpu", "events"],
        default="auto",
        help="events: time P2P ops with CUDA events (a GPU machine: needs a CUDA torch)",
    )
    ap.add_argument(
        "--events",
        action="store_true",
        help="only the CUDA-event transfer check of benchmarks/client.py --events (a P2P-like "
        "copy on a side stream timed by the integrations' event timer; skips without CUDA)",
    )
    ap.add_argument("--child", choices=INTEGRATIONS, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    CLIENT[0] = args.client
    TRANSFERS[0] = not args.no_transfers
    TIMING[0] = args.transfer_timing
    GPU[0] = args.gpu
    if args.smoke:
        args.iterations, args.microbatches, args.pairs = 3, 4, 4
    PAIRS[0] = args.pairs
    if args.events or (args.transfer_timing == "events" and not args.child):
        ev = event_check()
        if not ev["cuda"]:
            print(f"CUDA-event transfer check skipped: {ev['skipped']}", file=sys.stderr)
        if args.events or not ev["cuda"]:  # events timing needs CUDA: nothing else to run
            print(json.dumps({"transfer_events": ev}, indent=2))
            return
    if args.child:
        run = torch_rank if args.child == "torch" else deepspeed_rank
        res = run(args.rank, args.iterations, args.microbatches, args.width)
        if args.rank == 0:
            args.out.write_text(json.dumps(res))
        return
    results = {}
    for name in args.integration or INTEGRATIONS:
        load0 = os.getloadavg()[0]
        results[name] = launch(name, args)
        results[name]["load_average_1min"] = [load0, os.getloadavg()[0]]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    cols = [
        ("hook_us_median", "median us"),
        ("hook_us_p99", "p99 us"),
        ("hook_cpu_us_median", "cpu med us"),
        ("hook_cpu_us_p99", "cpu p99 us"),
        ("iteration_boundary_us_median", "iter us"),
        ("p2p_hook_us_median", "p2p us"),
        ("transfers_recorded_per_iteration", "transfers"),
        ("step_ms_plain_median", "plain ms"),
        ("step_ms_hooked_median", "hooked ms"),
        ("step_excess_us_per_instruction_median", "excess us"),
        ("clocks_match_plan", "clocks ok"),
    ]
    print(
        f"hooks' cost per instruction, rank 0, {args.iterations} iterations x "
        f"{args.microbatches} microbatches, a clock change at every instruction "
        "(net of the timers' floor)"
    )
    print(f"{'integration':12s}" + "".join(f"{c:>11s}" for _, c in cols))
    for name, res in results.items():
        cells = [
            f"{res[k]:11.2f}" if isinstance(res[k], float) else f"{res[k]!s:>11s}" for k, _ in cols
        ]
        lo, hi = res["step_excess_us_per_instruction_ci95"]
        load = res["load_average_1min"]
        print(
            f"{name:12s}" + "".join(cells) + f"  excess 95% CI [{lo:.1f}, {hi:.1f}] us/instr"
            f" over {res['pairs']} pairs; load {load[0]:.1f}-{load[1]:.1f}"
        )


if __name__ == "__main__":
    main()
