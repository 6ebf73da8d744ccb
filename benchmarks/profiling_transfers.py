"""Real P2P transfer times for ``benchmarks/profiling.py``: a chain of torch ranks over gloo.

``S`` ranks (one per stage) run a pipeline's P2P pattern for ``iterations`` iterations: per
microbatch each forward receives an activation from the previous rank, computes a little and
sends it on, then each backward does the same in reverse (all forwards first, then all
backwards: no order to deadlock on). Both ends time every transfer as the integrations do on
gloo (from posting the op to the end of its wait, on the CPU). The server's own
:class:`~perseus_server.decisions.link_fit.LinkCombiner` then gives each iteration one time per
link (per microbatch the smaller of the two ends, then the median): what a scan's reports carry.

``busy`` processes (``while True: pass``) run beside the ranks for the whole measurement: the
load of a host whose data loaders, checkpointing or other jobs share the cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
Link = tuple[int, str]
#: Iterations each rank runs (and discards) before the measured ones.
WARMUP = 2


@dataclass(frozen=True)
class TransferPool:
    """Per measured iteration, each link's time (seconds), in the order they ran."""

    iterations: list[dict[Link, float]]
    load_average: tuple[float, float]
    busy: int
    width: int

    def median(self, link: Link) -> float:
        """The link's median over every measured iteration."""
        xs = sorted(it[link] for it in self.iterations if link in it)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def rank_main(rank: int, world: int, iterations: int, microbatches: int, width: int) -> None:
    """One rank of the chain; writes its timed transfers as JSON to stdout's file argument."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.randn(16, width)
    buf = torch.empty(16, width)
    out: list[list[tuple[int, str, int, float]]] = []

    def timed(op: Any, tensor: Any, peer: int) -> float:
        t0 = time.perf_counter()
        op(tensor, peer).wait()
        return time.perf_counter() - t0

    for _ in range(WARMUP + iterations):
        rec: list[tuple[int, str, int, float]] = []
        for mb in range(microbatches):
            if rank > 0:
                rec.append((rank - 1, "forward", mb, timed(dist.irecv, buf, rank - 1)))
            y = torch.tanh(buf if rank > 0 else x)  # a little compute (not the point here)
            if rank < world - 1:
                rec.append((rank, "forward", mb, timed(dist.isend, y, rank + 1)))
        for mb in range(microbatches):
            if rank < world - 1:
                rec.append((rank, "backward", mb, timed(dist.irecv, buf, rank + 1)))
            g = torch.tanh(buf)
            if rank > 0:
                rec.append((rank - 1, "backward", mb, timed(dist.isend, g, rank - 1)))
        out.append(rec)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.write(json.dumps(out[WARMUP:]))


def busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that spin until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def measure(
    stages: int, iterations: int, microbatches: int, *, width: int = 4096, busy: int = 0
) -> TransferPool:
    """Run the chain of ``stages`` gloo ranks and combine the ends' times per iteration and link.

    ``busy`` loops run beside the ranks while they measure.
    """
    from perseus_server.decisions.link_fit import LinkCombiner

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    loops = busy_loops(busy)
    load0 = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            outs = [Path(tmp) / f"rank{r}.json" for r in range(stages)]
            procs: list[subprocess.Popen[bytes]] = []
            try:
                for r in range(stages):
                    with outs[r].open("w") as f:
                        args = [str(a) for a in (r, stages, iterations, microbatches, width)]
                        procs.append(
                            subprocess.Popen([sys.executable, str(HERE), *args], env=env, stdout=f)
                        )
                if any(p.wait(timeout=1800) for p in procs):
                    raise SystemExit("a transfer-measuring rank failed")
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            per_rank = [json.loads(o.read_text()) for o in outs]
    finally:
        for p in loops:
            p.kill()
            p.wait()
    load1 = os.getloadavg()[0]
    combiner = LinkCombiner()
    pool: list[dict[Link, float]] = []
    for i in range(iterations):
        times: dict[Link, float] = {}
        for r, its in enumerate(per_rank):
            groups: dict[Link, list[tuple[int, float]]] = {}
            for b, d, mb, t in its[i]:
                groups.setdefault((b, d), []).append((mb, t))
            for link, ts in groups.items():
                for m in combiner.add(link, f"rank{r}", i, ts):
                    times[link] = m
        pool.append(times)
    return TransferPool(pool, (load0, load1), busy, width)


if __name__ == "__main__":
    rank_main(*(int(a) for a in sys.argv[1:6]))
