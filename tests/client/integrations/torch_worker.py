"""One rank of a real ``torch.distributed.pipelining`` run (gloo, CPU).

Driven by a real Perseus server and client. Started as a subprocess by ``test_torch_pipelining.py``.

For every schedule named in the config the rank:

1. trains a tiny model for a few iterations *without* hooks (the reference losses);
2. rebuilds the identical model and schedule; rank 0 exports the schedule's order, creates a job
   with it on the server, uploads a profile slice, solves the frontier and deploys a slowed-down
   plan, then shares the job id and plan version with the other ranks;
3. every rank opens a ``PerseusClient`` on a recording ``SimulatedGpu``, waits for the plan, and
   trains the same iterations with the hooks installed;
4. writes what ran (instruction, microbatch, stage and the clock set before it), the plan it got,
   and both loss sequences to ``<out>/<schedule>.rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from integration_harness import (  # noqa: E402
    ServerApi,
    executed,
    plan_ops,
    profile_slice,
    simulated_gpu,
    wait_for_plan,
    write_result,
)
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as tsched  # noqa: E402

from perseus_client import PerseusClient, RankPosition, Reporting  # noqa: E402
from perseus_client.integrations import torch_pipelining  # noqa: E402

V_STYLE = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
WIDTH = 8
BATCH = 8


def stage_indices(name: str, rank: int, world: int) -> tuple[list[int], int]:
    """Model stages held by ``rank`` and the total number of model stages."""
    cls = getattr(tsched, name)
    if not issubclass(cls, tsched.PipelineScheduleMulti):
        return [rank], world
    total = 2 * world
    if name in V_STYLE:
        return [rank, total - 1 - rank], total
    return [rank, rank + world], total


def build(name: str, rank: int, world: int, microbatches: int) -> tuple[Any, list[int], int]:
    indices, total = stage_indices(name, rank, world)
    torch.manual_seed(1234)
    layers = [
        torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(total)
    ]
    stages = [PipelineStage(layers[i], i, total, torch.device("cpu")) for i in indices]
    cls = getattr(tsched, name)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    multi = issubclass(cls, tsched.PipelineScheduleMulti)
    schedule = cls(stages if multi else stages[0], microbatches, loss_fn=loss_fn)
    return schedule, indices, total


def train(schedule: Any, indices: list[int], total: int, iterations: int) -> list[float]:
    """Run ``iterations`` steps with SGD; return the per-microbatch losses this rank saw."""
    gen = torch.Generator().manual_seed(99)
    params = [
        p for st in torch_pipelining.schedule_stages(schedule) for p in st.submod.parameters()
    ]
    opt = torch.optim.SGD(params, lr=0.1)
    losses_out: list[float] = []
    for _ in range(iterations):
        x = torch.randn(BATCH, WIDTH, generator=gen)
        target = torch.randn(BATCH, WIDTH, generator=gen)
        losses: list[torch.Tensor] = []
        opt.zero_grad()
        kwargs: dict[str, Any] = {}
        if total - 1 in indices:
            kwargs = {"target": target, "losses": losses}
        if 0 in indices:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)
        opt.step()
        losses_out += [float(v) for v in losses]
    return losses_out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = json.loads(args.config.read_text())
    rank, world = args.rank, args.world
    dist.init_process_group("gloo", rank=rank, world_size=world)
    api = ServerApi(cfg["http_url"]) if rank == 0 else None
    try:
        for name in cfg["schedules"]:
            t0 = time.perf_counter()
            schedule, indices, total = build(name, rank, world, cfg["microbatches"])
            reference = train(schedule, indices, total, cfg["iterations"])

            schedule, indices, total = build(name, rank, world, cfg["microbatches"])
            orders = torch_pipelining.export_orders(schedule)
            shared: list[Any] = [None, None]
            if api is not None:
                job = api.create_job(orders, name=f"torch-{name}")
                api.solve(job, total)
                version = api.deploy(job, cfg["slowdown"])
                shared = [job, version]
            dist.broadcast_object_list(shared, src=0)
            job, version = shared

            gpu = simulated_gpu(profile_slice(total), indices)
            client = PerseusClient(
                cfg["grpc_target"],
                job=job,
                gpu=gpu,
                handle_signals=False,
                rank=RankPosition(global_rank=rank, pipeline_rank=rank),
                reporting=Reporting(report_interval=0.05),
            )
            try:
                plan = wait_for_plan(client, version)
                dist.barrier()
                with torch_pipelining.instrument(schedule, client):
                    hooked = train(schedule, indices, total, cfg["iterations"])
                used_version = client.plan_version
            finally:
                client.close()
            write_result(
                args.out,
                name,
                rank,
                {
                    "orders": orders,
                    "plan_version": plan.version,
                    "used_version": used_version,
                    "deployed_version": version,
                    "plan": [
                        [s.instruction, s.microbatch, s.stage, s.frequency_mhz] for s in plan.steps
                    ],
                    "plan_ops": plan_ops(plan),
                    "executed": executed(gpu),
                    "reference_losses": reference,
                    "hooked_losses": hooked,
                    "seconds": time.perf_counter() - t0,
                },
            )
            dist.barrier()
    finally:
        if api is not None:
            api.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
