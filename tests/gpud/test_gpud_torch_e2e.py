"""torch.distributed.pipelining ranks whose clock requests go through ``perseus gpud``.

Two gloo ranks, a real ``perseus serve``, a real ``PerseusClient`` per rank, and a ``--simulate``
daemon that locks every clock the server's plan gives (``torch_gpud_worker.py``).

Checked per rank: the executed order and the clock before each instruction are the plan's, the
losses equal the unhooked run's, and the daemon locked exactly the plan's clock changes (in
order, for that rank's pid, on that rank's GPU) and reset the GPU when the rank closed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gpud_harness
import pytest
from gpud_harness import Daemon, run_ranks
from integration_harness import read_results

pytest.importorskip("torch")

# The shared fixtures (see gpud_harness for why they are not in a conftest.py).
start_daemon = gpud_harness.start_daemon
workdir = gpud_harness.workdir

pytestmark = pytest.mark.slow

WORLD = 2
ITERATIONS = 2
SCHEDULE = "Schedule1F1B"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from perseus_server.testing.process import ServerProcess

    with ServerProcess(tmp_path_factory.mktemp("gpud-e2e") / "perseus.db") as srv:
        yield srv


def test_torch_ranks_lock_their_clocks_through_the_daemon(
    server: Any, start_daemon: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = start_daemon("--simulate", str(WORLD), "--log-level", "DEBUG")
    out = workdir / "out"
    config = {
        "schedule": SCHEDULE,
        "microbatches": 4,
        "iterations": ITERATIONS,
        "slowdown": 0.3,
        "http_url": server.http_url,
        "grpc_target": server.grpc_target,
        "socket": daemon.socket,
        "devices": str(daemon.dev_dir),
    }
    run_ranks("torch_gpud_worker.py", WORLD, config, out)
    results = read_results(out, SCHEDULE, WORLD)
    log = daemon.log()
    mixed: set[int] = set()
    for rank, res in enumerate(results):
        assert [op[:3] for op in res["executed"]] == res["plan_ops"] * ITERATIONS
        planned = [step[3] for step in res["plan"]] * ITERATIONS
        assert [op[3] for op in res["executed"]] == planned
        assert res["hooked_losses"] == res["reference_losses"]
        mixed |= set(planned)
        changes = [c for i, c in enumerate(planned) if i == 0 or c != planned[i - 1]]
        locked = [
            int(m)
            for m in re.findall(
                rf"GPU {rank}: locked the SM clock at (\d+) MHz for pid {res['pid']} uid 0", log
            )
        ]
        assert locked == changes, f"rank {rank}: the daemon locked {locked}, the plan {changes}"
        assert f"GPU {rank}: reset the SM clock for pid {res['pid']}" in log
    assert len(mixed) > 1, "the plan runs at one clock; the check would be vacuous"
    assert [row["holder"] for row in daemon.status()] == [None] * WORLD
