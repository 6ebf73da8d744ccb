"""One rank of a real DeepSpeed ``PipelineEngine`` run (CPU accelerator, gloo).

Driven by a real Perseus server and client. Started as a subprocess by ``test_deepspeed.py``.

The rank trains a 2-stage ``PipelineModule`` for a few ``train_batch`` calls without hooks (the
reference losses), then rebuilds the identical engine; rank 0 creates a job with the order exported
from ``TrainSchedule``, solves and deploys a slowed-down plan; every rank trains again with the
hooks and a ``PerseusClient`` on a recording ``SimulatedGpu`` and writes what ran.
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
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from integration_harness import (  # noqa: E402
    ServerApi,
    executed,
    plan_ops,
    profile_slice,
    simulated_gpu,
    wait_for_plan,
    write_result,
)

from perseus_client import PerseusClient, RankPosition, Reporting  # noqa: E402
from perseus_client.integrations import deepspeed as perseus_ds  # noqa: E402

WIDTH = 8
MICRO_BATCH = 2


def build_engine(world: int, microbatches: int) -> Any:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(1234)
    layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(2 * world)]
    module = PipelineModule(
        layers=layers, num_stages=world, loss_fn=torch.nn.MSELoss(), partition_method="uniform"
    )
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": microbatches,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=module, model_parameters=list(module.parameters()), config=config
    )
    return engine


def batches(iterations: int, microbatches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(99)
    return [
        (
            torch.randn(MICRO_BATCH, WIDTH, generator=gen),
            torch.randn(MICRO_BATCH, WIDTH, generator=gen),
        )
        for _ in range(iterations * microbatches)
    ]


def train(engine: Any, iterations: int, microbatches: int) -> list[float]:
    data = iter(batches(iterations, microbatches))
    return [float(engine.train_batch(data)) for _ in range(iterations)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = json.loads(args.config.read_text())
    rank, world, mbs, iters = args.rank, args.world, cfg["microbatches"], cfg["iterations"]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    os.environ.update(LOCAL_WORLD_SIZE=str(world))

    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist

    # The CPU accelerator would JIT-compile a shared-memory allreduce kernel (about 90 s on two
    # cores) that pipelining never uses; DeepSpeed keeps this table for that decision. gloo is used.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")

    t0 = time.perf_counter()
    reference = train(build_engine(world, mbs), iters, mbs)
    engine = build_engine(world, mbs)
    orders = perseus_ds.export_orders(engine.micro_batches, engine.num_stages)
    shared: list[Any] = [None, None]
    if rank == 0:
        api = ServerApi(cfg["http_url"])
        try:
            job = api.create_job(orders, name="deepspeed-train-schedule")
            api.solve(job, world)
            shared = [job, api.deploy(job, cfg["slowdown"])]
        finally:
            api.close()
    dist.broadcast_object_list(shared, src=0)
    job, version = shared

    gpu = simulated_gpu(profile_slice(world), [engine.stage_id])
    client = PerseusClient(
        cfg["grpc_target"],
        job=job,
        gpu=gpu,
        handle_signals=False,
        rank=RankPosition(global_rank=rank, pipeline_rank=engine.stage_id),
        reporting=Reporting(report_interval=0.05),
    )
    transfers: list[list[Any]] = []
    inner = client.record_transfer

    def record(b: int, d: str, m: int, s: float) -> None:
        transfers.append([b, d, m, s])
        inner(b, d, m, s)

    client.record_transfer = record  # type: ignore[method-assign]
    try:
        plan = wait_for_plan(client, version)
        dist.barrier()
        with perseus_ds.instrument(engine, client) as hooks:
            assert hooks.transfers
            hooked = train(engine, iters, mbs)
        reported = [list(t) for t in client.last_report.transfers] if client.last_report else []
        used_version = client.plan_version
        restored = "_INSTRUCTION_MAP" not in vars(engine) and "train_batch" not in vars(engine)
    finally:
        client.close()
    write_result(
        args.out,
        "deepspeed",
        rank,
        {
            "stage_id": engine.stage_id,
            "orders": orders,
            "plan_version": plan.version,
            "used_version": used_version,
            "deployed_version": version,
            "plan": [[s.instruction, s.microbatch, s.stage, s.frequency_mhz] for s in plan.steps],
            "plan_ops": plan_ops(plan),
            "executed": executed(gpu),
            "reference_losses": reference,
            "hooked_losses": hooked,
            "restored": restored,
            "transfers": transfers,
            "reported_last": reported,
            "seconds": time.perf_counter() - t0,
        },
    )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
