"""One rank of a real ``torch.distributed.pipelining`` run whose clock requests go through gpud.

The run is on gloo, CPU, its clocks locked through the node daemon. Started as a subprocess by
``test_gpud_torch_e2e.py``.

Like ``tests/client/integrations/torch_worker.py`` (whose model and training loop it reuses), but each
rank's GPU backend composes the in-process ``SimulatedGpu`` (durations, energy) with a
``DaemonGpu`` on GPU ``rank`` of a ``perseus gpud --simulate`` daemon (clock control): every
clock the plan asks for is locked by the daemon. Writes what ran and the plan it got to
``<out>/<schedule>.rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "client" / "integrations"))

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
from torch_worker import build, train  # noqa: E402

from perseus_client import (  # noqa: E402
    DaemonGpu,
    GpuBackend,
    PerseusClient,
    RankPosition,
    RecordingGpu,
    Reporting,
)
from perseus_client.integrations import torch_pipelining  # noqa: E402


class DaemonClocks(GpuBackend):
    """Clocks through the daemon (and the model, which needs them for its durations).

    Time, energy and instruction hooks from the in-process model.
    """

    synchronous_clocks = True

    def __init__(self, model: GpuBackend, daemon: DaemonGpu) -> None:
        self.model, self.daemon = model, daemon
        self.name = daemon.name

    def supported_clocks(self) -> tuple[int, ...]:
        return self.model.supported_clocks()

    def set_locked_clocks(self, mhz: int) -> None:
        self.daemon.set_locked_clocks(mhz)
        self.model.set_locked_clocks(mhz)

    def reset_locked_clocks(self) -> None:
        self.daemon.reset_locked_clocks()
        self.model.reset_locked_clocks()

    def energy_mj(self) -> int:
        return self.model.energy_mj()

    def timestamp(self) -> float:
        return self.model.timestamp()

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:
        self.daemon.begin_instruction(kind, microbatch, stage)
        self.model.begin_instruction(kind, microbatch, stage)

    def end_instruction(self) -> None:
        self.model.end_instruction()
        self.daemon.end_instruction()

    def abort_instruction(self) -> None:
        self.model.abort_instruction()
        self.daemon.abort_instruction()

    def close(self) -> None:
        self.daemon.close()


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
        name = cfg["schedule"]
        schedule, indices, total = build(name, rank, world, cfg["microbatches"])
        reference = train(schedule, indices, total, cfg["iterations"])
        schedule, indices, total = build(name, rank, world, cfg["microbatches"])
        orders = torch_pipelining.export_orders(schedule)
        shared: list[object] = [None, None]
        if api is not None:
            job = api.create_job(orders, name=f"gpud-{name}")
            api.solve(job, total)
            shared = [job, api.deploy(job, cfg["slowdown"])]
        dist.broadcast_object_list(shared, src=0)
        job, version = shared
        model = simulated_gpu(profile_slice(total), indices).inner
        # What CUDA does when it initialises GPU `rank`: open its device node (a stand-in).
        _device = open(f"{cfg['devices']}/nvidia{rank}", "rb")  # noqa: SIM115 - open for the run
        daemon = DaemonGpu(rank, socket=cfg["socket"])
        gpu = RecordingGpu(DaemonClocks(model, daemon))
        client = PerseusClient(
            cfg["grpc_target"],
            job=str(job),
            gpu=gpu,
            handle_signals=False,
            rank=RankPosition(global_rank=rank, pipeline_rank=rank),
            reporting=Reporting(report_interval=0.05),
        )
        try:
            plan = wait_for_plan(client, int(str(version)))
            dist.barrier()
            with torch_pipelining.instrument(schedule, client):
                hooked = train(schedule, indices, total, cfg["iterations"])
        finally:
            client.close()
            gpu.inner.close()
        write_result(
            args.out,
            name,
            rank,
            {
                "pid": os.getpid(),
                "plan": [
                    [s.instruction, s.microbatch, s.stage, s.frequency_mhz] for s in plan.steps
                ],
                "plan_ops": plan_ops(plan),
                "executed": executed(gpu),
                "reference_losses": reference,
                "hooked_losses": hooked,
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
