"""One rank of Megatron-core's 1F1B pipeline (2 ranks over gloo, CPU).

The Perseus hooks time its P2P transfers. Started as a subprocess by ``test_megatron_transfers.py``.

Megatron's pipelined schedule functions need CUDA, so the rank runs the calls of
``forward_backward_pipelining_without_interleaving`` itself, in its order: the real
``P2PCommunicator`` (``recv_forward``, ``send_forward``, ``send_forward_recv_backward``,
``send_backward_recv_forward``, ``recv_backward``, ``send_backward``) over the gloo group, and the
real ``forward_step`` / ``backward_step`` through the schedules module. The one stand-in is the
device: ``P2PCommunicator`` allocates its receive buffers on ``torch.cuda.current_device()``,
which here answers the CPU. Writes every ``record_transfer`` call and the losses.

With ``"backend": "nccl"`` in the config (a machine with a GPU per rank) nothing stands in: each
rank runs on its own GPU over NCCL, and the hooks time the transfers with CUDA events (the
integrations' choice for NCCL); their :class:`EventTiming` is resolved here, after the
iteration, and the worker writes which timer the hooks handed to ``record_transfer``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from integration_harness import profile_slice, simulated_gpu, write_result  # noqa: E402

from perseus_client import PerseusClient  # noqa: E402
from perseus_client.integrations import megatron as perseus_megatron  # noqa: E402
from perseus_client.measurements import EventTiming  # noqa: E402

WIDTH = 4
SHAPE = (2, WIDTH)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = json.loads(args.config.read_text())
    rank, pp, m = args.rank, args.world, int(cfg["microbatches"])
    backend = str(cfg.get("backend", "gloo"))
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device: Any = torch.device("cuda", rank)
    else:
        torch.cuda.current_device = lambda: "cpu"  # the device this machine lacks (docstring)
        device = torch.device("cpu")
    from megatron.core import ModelParallelConfig
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    dist.init_process_group(backend, rank=rank, world_size=pp)
    config = ModelParallelConfig(pipeline_dtype=torch.float32, batch_p2p_sync=False)
    first, last = rank == 0, rank == pp - 1

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(rank)
            self.lin = torch.nn.Linear(WIDTH, WIDTH)
            self.config = config
            self.model_type = ModelType.encoder_or_decoder
            self.input_tensor: Any = None

        def set_input_tensor(self, tensor: Any) -> None:
            self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

        def forward(self, x: Any) -> Any:
            return self.lin(x if self.input_tensor is None else self.input_tensor)

    model = Stage().to(device)
    gen = torch.Generator().manual_seed(7)
    batches = [
        (
            torch.randn(*SHAPE, generator=gen).to(device),
            torch.randn(*SHAPE, generator=gen).to(device),
        )
        for _ in range(m)
    ]
    store: list[Any] = []

    def step_func(data: Any, mod: Any) -> Any:
        x, y = next(data)
        out = mod(x)
        return out, lambda o: (((o - y) ** 2).mean(), {"loss": ((o - y) ** 2).mean().detach()})

    def forward(data: Any, inp: Any, i: int) -> Any:
        out, _ = schedules.forward_step(
            step_func, data, model, m, inp, store, config, 1, False,
            is_first_microbatch=i == 0, current_microbatch=i, is_last_stage=last,
        )  # fmt: skip
        return out

    def one_f_one_b(**_: Any) -> None:
        """forward_backward_pipelining_without_interleaving's calls, in its order."""
        comm = P2PCommunicator(dist.group.WORLD, config)
        data = iter(batches)
        warmup = min(pp - rank - 1, m)
        inputs, outputs = [], []
        for i in range(warmup):
            inp = comm.recv_forward(SHAPE, first)
            out = forward(data, inp, i)
            comm.send_forward(out, last)
            inputs.append(inp)
            outputs.append(out)
        inp = comm.recv_forward(SHAPE, first) if m - warmup > 0 else None
        for i in range(m - warmup):
            out = forward(data, inp, warmup + i)
            grad = comm.send_forward_recv_backward(out, SHAPE, last)
            inputs.append(inp)
            outputs.append(out)
            inp, out = inputs.pop(0), outputs.pop(0)
            in_grad = schedules.backward_step(inp, out, grad, model.model_type, config)
            if i == m - warmup - 1:
                inp = None
                comm.send_backward(in_grad, first)
            else:
                inp = comm.send_backward_recv_forward(in_grad, SHAPE, first)
        for _ in range(warmup):
            inp, out = inputs.pop(0), outputs.pop(0)
            grad = comm.recv_backward(SHAPE, last)
            in_grad = schedules.backward_step(inp, out, grad, model.model_type, config)
            comm.send_backward(in_grad, first)

    order = perseus_megatron.export_orders(m, pp)[rank]
    gpu = simulated_gpu(profile_slice(pp), [rank])
    transfers: list[list[Any]] = []
    timers: set[str] = set()
    with PerseusClient(offline=True, gpu=gpu, handle_signals=False) as client:
        inner = client.record_transfer

        def record(b: int, d: str, mb: int, s: Any) -> None:
            timers.add(type(s).__name__)
            transfers[-1].append([b, d, mb, s])
            inner(b, d, mb, s)

        client.record_transfer = record  # type: ignore[method-assign]
        with perseus_megatron.instrument(client, order) as hooks:
            assert hooks.transfers
            run = hooks.wrap(one_f_one_b)
            for _ in range(int(cfg["iterations"])):
                transfers.append([])
                run(forward_only=False)
                dist.barrier()
                # CUDA events (NCCL): resolved now, off the hooks' path, as the reporter does.
                transfers[-1] = [
                    [b, d, mb, s.seconds() if isinstance(s, EventTiming) else s]
                    for b, d, mb, s in transfers[-1]
                ]
            reported = [list(t) for t in client.last_report.resolved().transfers]
            calls = [list(c) for c in hooks.calls]
        restored = not getattr(P2PCommunicator._communicate, "_perseus_hook", False)
    write_result(
        args.out,
        "megatron",
        rank,
        {
            "order": order,
            "calls": calls,
            "transfers": transfers,
            "reported_last": reported,
            "restored": restored,
            "losses": len(store),
            "backend": backend,
            "timers": sorted(timers),
        },
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
