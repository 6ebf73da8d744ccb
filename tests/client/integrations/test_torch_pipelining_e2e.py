"""torch.distributed.pipelining with Perseus, for real.

2 gloo ranks, a real ``perseus serve``, a real ``PerseusClient`` per rank on a recording
``SimulatedGpu``.

For each schedule the job is created with the order exported from the schedule object, so the
server's DAG is the one the hooks must follow. Checked per rank: the executed (instruction,
microbatch, stage) sequence of every iteration equals the plan's, the plan equals the exported
order, the clock locked before each instruction is the plan's frequency for it, and the losses
equal those of the same run without hooks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from integration_harness import read_results, run_ranks

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCHEDULES = [
    "ScheduleGPipe",
    "Schedule1F1B",
    "ScheduleInterleaved1F1B",
    "ScheduleLoopedBFS",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV",
]
WORLD = 2
ITERATIONS = 2
MICROBATCHES = 4
#: Deploy a plan allowed 30 % slowdown, so that it mixes clocks (a max-clock plan would make the
#: clock check trivial).
SLOWDOWN = 0.3


@pytest.fixture(scope="module")
def results(
    perseus_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    out: Path = tmp_path_factory.mktemp("torch-pipelining")
    config = {
        "schedules": SCHEDULES,
        "microbatches": MICROBATCHES,
        "iterations": ITERATIONS,
        "slowdown": SLOWDOWN,
        "http_url": perseus_server.http_url,
        "grpc_target": perseus_server.grpc_target,
    }
    run_ranks("torch_worker.py", WORLD, config, out)
    return {name: read_results(out, name, WORLD) for name in SCHEDULES}


@pytest.mark.parametrize("name", SCHEDULES)
def test_executed_order_is_the_servers_plan(results: dict[str, Any], name: str) -> None:
    for rank, res in enumerate(results[name]):
        assert res["plan_ops"] == res["orders"][rank], (
            f"rank {rank}: the server's plan is not the exported order"
        )
        executed_ops = [op[:3] for op in res["executed"]]
        assert executed_ops == res["plan_ops"] * ITERATIONS, (
            f"rank {rank} ran another order than planned"
        )


@pytest.mark.parametrize("name", SCHEDULES)
def test_clock_before_each_instruction_is_the_planned_one(
    results: dict[str, Any], name: str
) -> None:
    mixed = set()
    for rank, res in enumerate(results[name]):
        assert res["used_version"] == res["deployed_version"] == res["plan_version"]
        planned = [step[3] for step in res["plan"]] * ITERATIONS
        ran_at = [op[3] for op in res["executed"]]
        assert ran_at == planned, f"rank {rank}: clocks differ from the deployed plan"
        mixed |= set(planned)
    assert len(mixed) > 1, (
        "the deployed plan runs everything at one clock; the check would be vacuous"
    )


@pytest.mark.parametrize("name", SCHEDULES)
def test_hooks_change_nothing_numerically(results: dict[str, Any], name: str) -> None:
    seen = 0
    for res in results[name]:
        assert res["hooked_losses"] == res["reference_losses"]
        seen += len(res["reference_losses"])
    assert seen == ITERATIONS * MICROBATCHES  # the last stage reported every microbatch's loss
