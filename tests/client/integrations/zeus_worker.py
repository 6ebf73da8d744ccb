"""The ranks of a pipeline trained under Zeus's unmodified ``PipelineFrequencyOptimizer`` over gloo.

Started as a subprocess by ``test_zeus_e2e.py`` against a real ``perseus serve --zeus``: it imports
torch and Zeus once, then forks one process per rank (each its own gloo rank; the imports, seconds
of CPU each, are shared), waits for them, and fails when one does (each rank's output is in
``rank<r>.log``). Each rank
holds one linear layer of a ``pp``-stage pipeline (``dp`` pipelines, their gradients all-reduced),
trains two iterations in synchronous 1F1B order (the order Merak and DeepSpeed run: each stage's
warm-up forwards, then one forward and one backward, then the remaining backwards), activations
and gradients sent between stages with gloo, and calls the optimizer's hooks around every
forward and backward as Zeus's Merak integration does. Only the GPU is fake
(:mod:`zeus_fake_gpu`: it records the clocks Zeus's frequency controller locks); it writes the
schedule it got, the instructions it ran and its losses.
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
from integration_harness import write_result  # noqa: E402
from zeus_fake_gpu import install  # noqa: E402

WIDTH = 8
BATCH = 2
ACTIVATION, GRADIENT = 0, 1  # gloo tags


def one_f_one_b(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Synchronous 1F1B (PipeDream-Flush) of one stage: ``(kind, microbatch)`` in order."""
    warmup = min(stages - stage - 1, microbatches)
    order = [("forward", m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("forward", warmup + i), ("backward", i)]
    order += [("backward", m) for m in range(microbatches - warmup, microbatches)]
    return order


class Stage:
    """One pipeline stage's layer, its neighbours, and the tensors a backward needs."""

    def __init__(self, rank: int, pp: int, microbatches: int) -> None:
        self.pp_rank = rank % pp
        self.first, self.last = self.pp_rank == 0, self.pp_rank == pp - 1
        self.prev, self.next = rank - 1, rank + 1
        torch.manual_seed(100 + self.pp_rank)  # every pipeline starts from the same weights
        self.layer = torch.nn.Linear(WIDTH, WIDTH)
        self.opt = torch.optim.SGD(self.layer.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(7)
        self.inputs = [torch.randn(BATCH, WIDTH, generator=gen) for _ in range(microbatches)]
        self.targets = [torch.randn(BATCH, WIDTH, generator=gen) for _ in range(microbatches)]
        self.microbatches = microbatches
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.sends: list[Any] = []
        self.loss = 0.0

    def forward(self, mb: int) -> None:
        if self.first:
            x = self.inputs[mb].clone().requires_grad_()
        else:
            x = torch.empty(BATCH, WIDTH)
            dist.recv(x, src=self.prev, tag=ACTIVATION)
            x.requires_grad_()
        y = self.layer(x)
        if self.last:
            y = torch.nn.functional.mse_loss(y, self.targets[mb]) / self.microbatches
            self.loss += float(y)
        else:
            out = y.detach().clone()
            self.sends.append((dist.isend(out, dst=self.next, tag=ACTIVATION), out))
        self.saved[mb] = (x, y)

    def backward(self, mb: int) -> None:
        x, y = self.saved.pop(mb)
        if self.last:
            y.backward()
        else:
            grad = torch.empty(BATCH, WIDTH)
            dist.recv(grad, src=self.next, tag=GRADIENT)
            y.backward(grad)
        if not self.first:
            assert x.grad is not None
            g = x.grad.detach().clone()
            self.sends.append((dist.isend(g, dst=self.prev, tag=GRADIENT), g))

    def step(self, dp_group: Any, dp: int) -> float:
        for handle, _ in self.sends:
            handle.wait()
        self.sends.clear()
        if dp_group is not None:
            for p in self.layer.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= dp
        self.opt.step()
        self.opt.zero_grad()
        loss, self.loss = self.loss, 0.0
        return loss


def launch(world: int, cfg: dict[str, Any], out: Path) -> int:
    """Fork ``world`` ranks, wait for them; 0 when every one exits 0."""
    sys.stdout.flush()
    sys.stderr.flush()
    pids = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:  # the rank: its output to its log; exits through the interpreter (atexit)
            fd = os.open(out / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.exit(run_rank(rank, world, cfg, out))
        pids[pid] = rank
    failed = 0
    for _ in range(world):
        pid, status = os.wait()
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"rank {pids[pid]} exited with {os.waitstatus_to_exitcode(status)}")
            failed += 1
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import zeus.optimizer.pipeline_frequency  # noqa: F401  (imported once, before the fork)

    return launch(args.world, json.loads(args.config.read_text()), args.out)


def run_rank(rank: int, world: int, cfg: dict[str, Any], out: Path) -> int:
    """Train as rank ``rank``; 0 when done."""
    pp, dp, microbatches = int(cfg["pp"]), int(cfg["dp"]), int(cfg["microbatches"])
    assert world == pp * dp
    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = [dist.new_group([d * pp + s for d in range(dp)]) for s in range(pp)] if dp > 1 else []
    install(cfg["clocks"], out / f"clocks.rank{rank}.jsonl")

    from zeus.optimizer.pipeline_frequency import PipelineFrequencyOptimizer

    stage = Stage(rank, pp, microbatches)
    try:
        pfo = PipelineFrequencyOptimizer(
            rank=rank,
            dp_rank=rank // pp,
            pp_rank=stage.pp_rank,
            tp_rank=0,
            device_id=0,
            dp_degree=dp,
            pp_degree=pp,
            tp_degree=1,
            world_size=world,
            server_url=cfg["server_url"],
            job_metadata=cfg.get("metadata"),
        )
    except RuntimeError as e:  # a refusal the test expects: what the client raised
        if not cfg.get("expect_error"):
            raise
        write_result(out, "zeus", rank, {"error": str(e)})
        dist.destroy_process_group()
        return 0
    ran: list[list[str]] = []
    losses = []
    for _ in range(2):
        pfo.on_step_begin()
        names = []
        for kind, mb in one_f_one_b(pp, microbatches, stage.pp_rank):
            pfo.on_instruction_begin(kind)
            if kind == "forward":
                stage.forward(mb)
            else:
                stage.backward(mb)
            pfo.on_instruction_end(kind)
            names.append(kind)
        losses.append(stage.step(groups[stage.pp_rank] if groups else None, dp))
        pfo.on_step_end()
        ran.append(names)
    write_result(
        out,
        "zeus",
        rank,
        {
            "job_id": pfo.job_id,
            "schedule": [list(item) for item in pfo.freq_schedule],
            "ran": ran,
            "losses": losses,
            "pp_rank": stage.pp_rank,
            "dp_rank": rank // pp,
            "pid": os.getpid(),
        },
    )
    dist.destroy_process_group()
    # Zeus's controller process is ended and joined at exit (atexit), after its last clock.
    return 0


if __name__ == "__main__":
    sys.exit(main())
