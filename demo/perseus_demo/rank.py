"""One training rank of ``perseus demo``.

A real ``torch.distributed.pipelining`` stage over gloo with a Perseus client on a simulated GPU.

Started by :mod:`perseus_demo.orchestration` as ``python -m perseus_demo.rank --config CFG`` with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. Global rank ``g`` is stage
``g % stages`` of data-parallel pipeline ``g // stages``. The rank is started while the server
sets the job up: it builds its stage and process groups, then waits for the job's part of its
config (:data:`~perseus_demo.phases.JOB_FILE`) before phase 1. Each pipeline has its own process
group for its point-to-point traffic; each stage's data-parallel peers share a group in which
their gradients are all-reduced after every step, which is where a fast pipeline waits for a slow
one (the GPU draws blocking power meanwhile, like a real one in NCCL's all-reduce).

The rank runs the demo's phases back to back:

1. ``max-clocks``: the client has no plan (offline), so every instruction runs at the top clock;
2. ``perseus``: connected to the server, the deployed plan; each of its steps is followed by a
   step at max clocks through the same client (recorded as phase ``max-clocks-interleaved``,
   see :data:`perseus_demo.phases.REFERENCES`), so that the plan's step time is compared with
   max clocks measured under the same conditions (load on the machine, the client's threads,
   the server's work); the client reports those steps without an energy reading, so the
   server's measured power and energy saved count the plan's steps only;
3. ``straggler``: pipeline 1's simulated GPUs are slowed (``SimulatedGpu.set_time_factor``);
4. ``recovery``: back to full speed;
5. ``power-budget``: once every rank is done with phase 4, rank 0 sets the job's power budget
   through the server's REST API (``PUT /jobs/{id}/plan`` with ``power_budget``, the watts the
   orchestrator worked out) and every rank waits for the plan the server picks under it; its
   steps are followed by max-clock steps too (``max-clocks-interleaved-power-budget``), for
   the comparison with a uniform power limit, whose slowdown is against max clocks.

After every step (after the gradient all-reduce) it reads its GPU's simulated clock and energy
counter, and it writes ``rank<g>.json`` with one record per step: phase, step time and energy
(everything between two gradient syncs, waiting included), the time the client measured for
the iteration itself, and the plan it ran. It also keeps the per-instruction timeline of the last
step of each phase (start, end and clock) for the demo's timeline plot.
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

from perseus_client import PerseusClient, RankPosition, Reporting, SimulatedGpu
from perseus_client.integrations import torch_pipelining
from perseus_demo.phases import JOB_FILE, PHASES, REFERENCES
from perseus_demo.timeline import TimelineGpu

__all__ = ["main"]

#: The width of each stage's one linear layer.
WIDTH = 16


def _build(cfg: dict[str, Any], rank: int) -> tuple[Any, ...]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B

    stages, pipelines = int(cfg["stages"]), int(cfg["pipelines"])
    pipe, stage = divmod(rank, stages)
    # Every rank creates every group, in the same order (a torch.distributed requirement).
    pipe_groups = [
        dist.new_group(list(range(p * stages, (p + 1) * stages))) for p in range(pipelines)
    ]
    dp_groups = [dist.new_group([p * stages + s for p in range(pipelines)]) for s in range(stages)]
    torch.manual_seed(1234 + stage)  # the same weights in every pipeline (data parallelism)
    layer = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
    pstage = PipelineStage(layer, stage, stages, torch.device("cpu"), group=pipe_groups[pipe])

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    schedule = Schedule1F1B(pstage, int(cfg["microbatches"]), loss_fn=loss_fn)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    return schedule, layer, opt, dp_groups[stage], pipe, stage


def _simulated_gpu(cfg: dict[str, Any], stage: int) -> SimulatedGpu:
    """The simulated GPU of ``stage``, from the run's profile."""
    return SimulatedGpu.from_profile_csv(
        cfg["profile_csv"],
        stage=stage,
        blocking_power=float(cfg["blocking_power"]),
        time_scale=float(cfg["time_scale"]),
        name="simulated A100",
    )


def _step_record(
    client: Any, phase: str, index: int, step_time: float, energy_mj: int, slowdown: float
) -> dict[str, Any]:
    """One step's record in ``rank<g>.json``: its time and energy, and the plan it ran."""
    rep = client.last_report
    plan = client.plan
    return {
        "phase": phase,
        "index": index,
        "step_time": step_time,
        "energy": energy_mj / 1000.0,
        "iteration_time": rep.iteration_time if rep is not None else None,
        "plan_version": plan.version if plan is not None else 0,
        "expected_time": plan.expected_iteration_time if plan is not None else None,
        "reason": plan.reason if plan is not None else "max clocks (no plan)",
        "slowdown": slowdown,
    }


def _enter_power_budget(client: Any, cfg: dict[str, Any], rank: int) -> None:
    """Phase 5's start: rank 0 sets the budget, every rank waits for the server's plan."""
    import torch.distributed as dist

    dist.barrier()  # nobody is still running phase 4 under the old plan
    box = [0]
    failure: BaseException | None = None
    if rank == 0:
        import httpx

        try:
            r = httpx.put(
                f"{cfg['http_url']}/jobs/{cfg['job']}/plan",
                json={"power_budget": float(cfg["power_budget"])},
                timeout=60.0,
            )
            if r.status_code >= 400:
                raise RuntimeError(f"PUT /jobs/{cfg['job']}/plan: {r.status_code} {r.text}")
            box[0] = int(r.json()["version"])
        except Exception as exc:  # noqa: BLE001 - re-raised after telling the other ranks
            failure = exc
            box[0] = -1  # sentinel: the other ranks must not wait for a plan
    dist.broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    if box[0] < 0:
        raise RuntimeError(f"rank {rank}: rank 0 could not set the power budget")
    _wait_for_plan(client, box[0], rank)


def _wait_for_plan(client: Any, version: int, rank: int) -> None:
    """Until ``client`` holds plan ``version`` or a later one (a minute at most)."""
    deadline = time.monotonic() + 60.0
    while client.latest_plan is None or client.latest_plan.version < version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank} never received plan version {version}")
        time.sleep(0.02)


def _reference_step(
    client: Any, gpu: TimelineGpu, train_step: Any, phase: str, index: int, last: tuple[float, int]
) -> tuple[float, int]:
    """One step at max clocks through the connected ``client``, its plan put back after.

    Recorded as phase ``REFERENCES[phase]`` (:data:`~perseus_demo.phases.REFERENCES`;
    ``train_step(client, label, index, last)`` runs and records a step). ``gpu`` hides the
    step's energy from the client (:meth:`~perseus_demo.timeline.TimelineGpu.unmetered`).
    """
    plan = client.latest_plan
    client.use_plan(None)  # from the next iteration boundary: no plan, the top clock
    try:
        with gpu.unmetered():
            return train_step(client, REFERENCES[phase], index, last)
    finally:
        if client.latest_plan is None:  # the server sent nothing newer meanwhile
            client.use_plan(plan)


def _write_result(cfg: dict[str, Any], doc: dict[str, Any], rank: int) -> None:
    """``rank<g>.json`` in the run's folder, written whole or not at all."""
    out = Path(cfg["out_dir"]) / f"rank{rank}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out)


def _wait_for_job(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    """The job's part of the config, once the orchestrator hands it over (:data:`JOB_FILE`)."""
    path = Path(cfg["out_dir"]) / JOB_FILE
    deadline = time.monotonic() + float(cfg.get("job_timeout", 600.0))
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: no job in {path}")
        time.sleep(0.05)
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def main(argv: list[str] | None = None) -> int:
    """Run one rank of the demo; returns the exit status.

    ``RANK`` and ``WORLD_SIZE`` come from the environment, the rest from ``--config``.
    """
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(prog="python -m perseus_demo.rank")
    ap.add_argument("--config", type=Path, required=True)
    args = ap.parse_args(argv)
    cfg = json.loads(args.config.read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    t_start = time.perf_counter()

    def note(what: str) -> None:
        print(
            f"rank {rank}: {what} at {time.perf_counter() - t_start:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    dist.init_process_group("gloo", rank=rank, world_size=world)
    schedule, layer, opt, dp_group, pipe, stage = _build(cfg, rank)
    stages, microbatches = int(cfg["stages"]), int(cfg["microbatches"])
    sim = _simulated_gpu(cfg, stage)
    gpu = TimelineGpu(sim)
    gen = torch.Generator().manual_seed(7 + pipe)
    steps: list[dict[str, Any]] = []
    timelines: dict[str, dict[str, Any]] = {}
    n = int(cfg["iterations"])
    slow = float(cfg["straggler"])
    slow_pipe = int(cfg["straggler_pipeline"])

    def train_step(
        client: Any, phase: str, index: int, last: tuple[float, int]
    ) -> tuple[float, int]:
        x = torch.randn(2 * microbatches, WIDTH, generator=gen)
        target = torch.randn(2 * microbatches, WIDTH, generator=gen)
        gpu.spans = []
        opt.zero_grad()
        kwargs: dict[str, Any] = {}
        if stage == stages - 1:
            kwargs["target"] = target
        if stage == 0:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)
        # Data-parallel gradient sync: the iteration barrier between pipelines.
        for p in layer.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=dp_group)
        opt.step()
        t, e = gpu.timestamp(), int(sim.energy_mj())  # the true counter, unmetered steps too
        steps.append(_step_record(client, phase, index, t - last[0], e - last[1], sim.time_factor))
        timelines[phase] = {"index": index, "spans": list(gpu.spans)}
        return t, e

    def sync() -> tuple[float, int]:
        dist.barrier()
        return gpu.timestamp(), int(sim.energy_mj())

    cfg.update(_wait_for_job(cfg, rank))  # the server's job: ready by now, or soon
    # Phase 1: no Perseus plan, every instruction at the top clock.
    offline = PerseusClient(
        offline=True, gpu=gpu, handle_signals=False, rank=RankPosition(global_rank=rank)
    )
    last = sync()
    note("phase max-clocks starts")
    with torch_pipelining.instrument(schedule, offline):
        for i in range(n):
            last = train_step(offline, PHASES[0], i, last)
    offline.close()

    # Phases 2-5: the connected client with the server's plans.
    client = PerseusClient(
        cfg["grpc_target"],
        job=cfg["job"],
        gpu=gpu,
        handle_signals=False,
        rank=RankPosition(global_rank=rank, pipeline_rank=stage, data_rank=pipe),
        reporting=Reporting(report_interval=0.02),
    )
    try:
        _wait_for_plan(client, int(cfg["plan_version"]), rank)
        last = sync()
        with torch_pipelining.instrument(schedule, client):
            for phase in PHASES[1:]:
                if phase == "power-budget":
                    _enter_power_budget(client, cfg, rank)
                    last = sync()
                note(f"phase {phase} starts")
                if pipe == slow_pipe:
                    sim.set_time_factor(1.0 + slow if phase == "straggler" else 1.0)
                for i in range(n):
                    last = train_step(client, phase, i, last)
                    if phase in REFERENCES:
                        last = _reference_step(client, gpu, train_step, phase, i, last)
    finally:
        client.close()
    dist.barrier()
    note("done")
    doc = {
        "rank": rank,
        "pipeline": pipe,
        "stage": stage,
        "time_scale": float(cfg["time_scale"]),
        "steps": steps,
        "timelines": timelines,
    }
    _write_result(cfg, doc, rank)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
