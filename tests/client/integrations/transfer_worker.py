"""One rank of a real ``torch.distributed.pipelining`` run (gloo, CPU).

The Perseus hooks time its P2P transfers. Started as a subprocess by ``test_torch_pipelining_transfers.py``.

For every schedule named in the config the rank trains a few iterations with the hooks and an
offline ``PerseusClient`` on a recording ``SimulatedGpu`` and writes every
``record_transfer(boundary, direction, microbatch, seconds)`` call the hooks made, per iteration.
With ``delay`` set, the last rank waits that many seconds before posting its receive of
microbatch 0's activations in the last iteration (a receiver late for one transfer).
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

import torch.distributed as dist  # noqa: E402
from integration_harness import profile_slice, simulated_gpu, write_result  # noqa: E402
from torch_worker import build, train  # noqa: E402

from perseus_client import PerseusClient  # noqa: E402
from perseus_client.integrations import torch_pipelining  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = json.loads(args.config.read_text())
    rank, world = args.rank, args.world
    iterations, delay = int(cfg["iterations"]), float(cfg.get("delay", 0.0))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name in cfg["schedules"]:
            schedule, indices, total = build(name, rank, world, cfg["microbatches"])
            late = {"now": False}
            if delay and rank == world - 1:
                for stage in torch_pipelining.schedule_stages(schedule):
                    original = stage.get_fwd_recv_ops

                    def late_recv(
                        mb: int, *a: Any, _orig: Any = original, _late: Any = late, **k: Any
                    ) -> Any:
                        if _late["now"] and mb == 0:
                            time.sleep(delay)
                        return _orig(mb, *a, **k)

                    stage.get_fwd_recv_ops = late_recv
            gpu = simulated_gpu(profile_slice(total), indices)
            per_iteration: list[list[list[Any]]] = []
            reported: list[Any] = []
            with PerseusClient(offline=True, gpu=gpu, handle_signals=False) as client:
                inner = getattr(client, "record_transfer", None)

                def record(
                    b: int, d: str, m: int, s: float, _inner: Any = inner, _to: Any = per_iteration
                ) -> None:
                    _to[-1].append([b, d, m, s])
                    if _inner is not None:
                        _inner(b, d, m, s)

                client.record_transfer = record  # type: ignore[method-assign]
                dist.barrier()
                with torch_pipelining.instrument(schedule, client) as hooks:
                    assert hooks.transfers
                    for i in range(iterations):
                        per_iteration.append([])
                        late["now"] = i == iterations - 1
                        train(schedule, indices, total, 1)
                        report = client.last_report
                        reported.append(
                            [list(t) for t in getattr(report, "transfers", ())]
                            if report is not None
                            else None
                        )
                outside: list[Any] = []
                per_iteration.append(outside)
                train(schedule, indices, total, 1)  # hooks removed: nothing recorded
            write_result(
                args.out,
                name,
                rank,
                {
                    "indices": indices,
                    "total": total,
                    "transfers": per_iteration[:-1],
                    "after_remove": outside,
                    "reported": reported,
                },
            )
            dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
