"""Measured links end to end: two real torch ranks over gloo.

A P2P transfer latency injected per stage boundary, online profiling that measures it, and a link
slowed mid-run.

:func:`run_links` starts a job of ``stages`` stages (GPipe) on a running server and
``stages`` rank processes (``python -m perseus_demo.links --config CFG``). Each rank runs its
stage's instructions in the schedule's order on a :class:`~perseus_client.SimulatedGpu` (the
profile's times scaled by ``time_scale``) and sends every microbatch's activations forward and
gradients backward with ``torch.distributed.send``/``recv`` over gloo. A link's latency is
injected on the sending side (:meth:`SimulatedGpu.transfer`, overlapping the real send: the
transfer takes the longer of the two), and the sender times the whole transfer and reports it
(:meth:`PerseusClient.record_transfer`).

The ranks run three parts:

1. rank 0 starts online profiling of the job's clocks; the ranks train until the server deploys
   the plan solved from the measured profile (whose communication part holds the measured
   transfer times);
2. ``steady`` iterations under that plan;
3. the forward link of boundary 0 is slowed to ``slow_factor`` times its latency; the ranks
   train until they hold the plan re-solved for it (at most ``after`` iterations; the server
   deploys from its solved frontier before that, a version the records show), then one
   more iteration under it; rank 0 records, per iteration, whether the server's status names
   the slow link (and its re-solve) and which plan version it has received.

Every rank writes ``rank<g>.json`` (its iterations: part, plan version, the latest plan version
received, and on rank 0 the slow links the status named).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["LINKS_MODULE", "run_links", "main"]

#: The module every rank process runs.
LINKS_MODULE = "perseus_demo.links"
WIDTH = 16


class _NoReport:
    transfers: tuple[tuple[int, str, int, float], ...] = ()


_NONE = _NoReport()


def _order(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    from perseus.schedules import make_schedule

    sched = make_schedule("gpipe", stages, microbatches)
    return [(op.kind, op.microbatch) for op in sched.orders[stage]]


class _LinksRank:
    """One rank's run; the three parts of the module docstring are its methods.

    It holds its client, simulated GPU and process group, the iteration it trains and the
    records it keeps.
    """

    def __init__(self, cfg: dict[str, Any], rank: int, world: int) -> None:
        import httpx
        import torch
        import torch.distributed as dist

        from perseus_client import PerseusClient, RankPosition, Reporting, SimulatedGpu

        self.cfg, self.rank, self.dist = cfg, rank, dist
        self.stages, microbatches = world, int(cfg["microbatches"])
        profile = {
            (int(s), str(k)): {int(f): (float(t), float(e)) for f, t, e in pts}
            for s, k, pts in cfg["profile"]
        }
        self.latency = float(cfg["latency"])
        self.gpu = SimulatedGpu(
            profile,
            stage=rank,
            blocking_power=float(cfg["blocking_power"]),
            time_scale=float(cfg["time_scale"]),
            name="simulated A100",
            transfer_times={
                (b, d): self.latency
                for b in range(self.stages - 1)
                for d in ("forward", "backward")
            },
        )
        self.client = PerseusClient(
            cfg["grpc_target"],
            job=cfg["job"],
            gpu=self.gpu,
            handle_signals=False,
            rank=RankPosition(global_rank=rank, pipeline_rank=rank),
            reporting=Reporting(report_interval=0.02),
        )
        self.http = httpx.Client(base_url=cfg["http_url"], timeout=30.0)
        self.order = _order(self.stages, microbatches, rank)
        self.act = torch.zeros(WIDTH)
        self.grad = torch.zeros(WIDTH)
        self.records: list[dict[str, Any]] = []
        self.started = time.monotonic()

    def send(self, boundary: int, direction: str, mb: int, tensor: Any, dst: int) -> None:
        # The link's latency overlaps the real send: the transfer takes the longer of the two.
        t0 = self.gpu.timestamp()
        req = self.dist.isend(tensor, dst)
        self.gpu.transfer(boundary, direction)
        if req is not None:
            req.wait()
        self.client.record_transfer(boundary, direction, mb, self.gpu.timestamp() - t0)

    def iteration(self) -> None:
        client, dist, rank, stages = self.client, self.dist, self.rank, self.stages
        with client.iteration():
            for kind, mb in self.order:
                if kind == "forward":
                    if rank > 0:
                        dist.recv(self.act, rank - 1)
                    with client.instruction("forward", microbatch=mb):
                        pass
                    if rank < stages - 1:
                        self.send(rank, "forward", mb, self.act, rank + 1)
                else:
                    if rank < stages - 1:
                        dist.recv(self.grad, rank + 1)
                    with client.instruction(kind, microbatch=mb):
                        pass
                    if rank > 0:
                        self.send(rank - 1, "backward", mb, self.grad, rank - 1)
        dist.barrier()

    def agree(self, flag: bool) -> bool:
        """Rank 0's decision, the same on every rank."""
        box = [flag]
        self.dist.broadcast_object_list(box, src=0)
        return bool(box[0])

    def record(self, part: str, extra: dict[str, Any] | None = None) -> None:
        client = self.client
        latest = client.latest_plan
        self.records.append(
            {
                "part": part,
                "plan_version": client.plan_version,
                "latest_version": latest.version if latest is not None else 0,
                "wall": time.monotonic() - self.started,
                "iteration_time": client.last_report.iteration_time if client.last_report else None,
                "profiling_clock": (
                    client.plan.profiling.frequency_mhz
                    if client.plan is not None and client.plan.profiling is not None
                    else None
                ),
                "transfers": [
                    [b, d, m, t] for b, d, m, t in (client.last_report or _NONE).transfers
                ],
                **(extra or {}),
            }
        )

    def start_profiling(self) -> None:
        """Every rank registered; rank 0 starts online profiling and waits for its first task."""
        cfg, client = self.cfg, self.client
        deadline = time.monotonic() + 60.0
        while client.rank_id is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank} never registered")
            time.sleep(0.02)
        self.dist.barrier()
        if self.rank == 0:
            r = self.http.post(f"/jobs/{cfg['job']}/profiling", json=cfg["profiling"])
            if r.status_code != 202:
                raise RuntimeError(f"POST profiling: {r.status_code} {r.text}")
            deadline = time.monotonic() + 30.0
            while client.latest_plan is None or client.latest_plan.profiling is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("no profiling task arrived")
                time.sleep(0.02)
        self.dist.barrier()

    def profile(self) -> None:
        """Part 1: online profiling, until the plan solved from the measured profile is here."""
        limit = time.monotonic() + float(self.cfg["timeout"])
        while True:
            self.iteration()
            self.record("profiling")
            done = False
            if self.rank == 0:  # the frontier's plan deployed (not max clocks while it is solved)
                dep = self.http.get(f"/jobs/{self.cfg['job']}/status").json()["plan"] or {}
                plan = self.client.latest_plan
                done = (
                    dep.get("kind") == "plan"
                    and plan is not None
                    and plan.version >= int(dep["version"])
                )
            if self.agree(done):
                break
            if time.monotonic() > limit:
                raise TimeoutError("online profiling did not end in a plan")

    def steady(self) -> None:
        """Part 2: steady iterations under the plan."""
        for _ in range(int(self.cfg["steady"])):
            self.iteration()
            self.record("steady")

    def slow_link(self) -> None:
        """Part 3: the forward link of boundary 0 slows down.

        The rank trains on until the re-solved plan is here, then one iteration under it.
        """
        latest = self.client.latest_plan
        before = latest.version if latest is not None else 0
        self.gpu.set_transfer_time(0, "forward", self.latency * float(self.cfg["slow_factor"]))
        for _ in range(int(self.cfg["after"])):
            self.iteration()
            extra: dict[str, Any] = {}
            replanned = False
            if self.rank == 0:
                st = self.http.get(f"/jobs/{self.cfg['job']}/status").json()
                extra["slow_links"] = st["pipelines"][0]["slow_links"]
                extra["slow_stages"] = st["pipelines"][0]["slow_stages"]
                plan = self.client.latest_plan
                # The re-solved plan (the server acts from the solved frontier first: a plan
                # version before the re-solve's, which the records show too).
                resolved = (extra["slow_stages"] or {}).get("status") == "ready"
                replanned = (
                    resolved
                    and plan is not None
                    and plan.version > before
                    and plan.version >= int((st["plan"] or {}).get("version", 0))
                )
            self.record("slowed", extra)
            if self.agree(replanned):
                self.iteration()  # one iteration under the re-solved plan
                self.record("replanned")
                break


def main(argv: list[str] | None = None) -> int:
    """Run one rank of the links demo; returns the exit status.

    ``RANK`` and ``WORLD_SIZE`` come from the environment, the rest from ``--config``.
    """
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(prog="python -m perseus_demo.links")
    ap.add_argument("--config", type=Path, required=True)
    args = ap.parse_args(argv)
    cfg = json.loads(args.config.read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    run = _LinksRank(cfg, rank, world)
    try:
        run.start_profiling()
        run.profile()
        run.steady()
        run.slow_link()
    finally:
        run.client.close()
        run.http.close()
    out = Path(cfg["out_dir"]) / f"rank{rank}.json"
    out.write_text(json.dumps({"rank": rank, "iterations": run.records}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run_links(
    grpc_target: str,
    http_url: str,
    *,
    profile: dict[tuple[int, str], dict[int, tuple[float, float]]],
    blocking_power: float,
    latency: float,
    microbatches: int = 2,
    time_scale: float = 1.0,
    steady: int = 2,
    after: int = 40,
    slow_factor: float = 4.0,
    detection: dict[str, Any] | None = None,
    profiling: dict[str, Any] | None = None,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Create the job and run its ranks (see the module docstring).

    Returns the job id and each rank's iteration records.
    """
    import httpx

    from perseus_demo.orchestration import run_ranks

    stages = len({s for s, _ in profile})
    with httpx.Client(base_url=http_url, timeout=30.0) as http:
        r = http.post(
            "/jobs",
            json={
                "stages": stages,
                "microbatches": microbatches,
                "schedule": "gpipe",
                "blocking_power": blocking_power,
            },
        )
        r.raise_for_status()
        job = str(r.json()["id"])
        body = detection or {"threshold": 0.05, "consecutive": 3, "recovery": 0.02}
        http.put(f"/jobs/{job}/straggler-detection", json=body).raise_for_status()
    clocks = sorted({f for pts in profile.values() for f in pts}, reverse=True)
    with tempfile.TemporaryDirectory(prefix="perseus-links-") as tmp:
        cfg = {
            "grpc_target": grpc_target,
            "http_url": http_url,
            "job": job,
            "microbatches": microbatches,
            "profile": [
                [s, k, [[f, t, e] for f, (t, e) in pts.items()]] for (s, k), pts in profile.items()
            ],
            "blocking_power": blocking_power,
            "time_scale": time_scale,
            "latency": latency,
            "steady": steady,
            "after": after,
            "slow_factor": slow_factor,
            "profiling": profiling
            or {
                "frequencies": clocks,
                "warmup_iterations": 1,
                "iterations_per_frequency": 2,
                "stop_after_rises": 1,
                "tolerance": 0.0,
            },
            "timeout": timeout,
            "out_dir": tmp,
        }
        run_ranks(cfg, stages, Path(tmp), timeout + 60.0, module=LINKS_MODULE)
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(stages)]
    return {"job": job, "ranks": ranks}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
