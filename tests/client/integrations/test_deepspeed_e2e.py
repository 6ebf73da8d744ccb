"""DeepSpeed ``PipelineEngine`` with Perseus, for real.

A 2-stage ``PipelineModule`` on 2 gloo ranks (CPU accelerator), ``TrainSchedule``, a real ``perseus
serve`` and real clients.

The job is created with the order exported from ``TrainSchedule``; checked per rank: every
iteration ran exactly the server's plan (instruction, microbatch, stage), at the plan's clock, and
the losses equal those of the same run without hooks; removing the hooks restores the engine; the
hooks timed exactly the P2P transfers ``TrainSchedule`` runs (boundary, direction, microbatch) and
the client's last report carries the last iteration's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from integration_harness import read_results, run_ranks

pytest.importorskip("deepspeed")

pytestmark = pytest.mark.slow

WORLD = 2
ITERATIONS = 2
MICROBATCHES = 4
SLOWDOWN = 0.3


@pytest.fixture(scope="module")
def results(perseus_server: Any, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out: Path = tmp_path_factory.mktemp("deepspeed")
    config = {
        "microbatches": MICROBATCHES,
        "iterations": ITERATIONS,
        "slowdown": SLOWDOWN,
        "http_url": perseus_server.http_url,
        "grpc_target": perseus_server.grpc_target,
    }
    run_ranks("deepspeed_worker.py", WORLD, config, out)
    return read_results(out, "deepspeed", WORLD)


def test_executed_order_is_the_servers_plan(results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        assert res["stage_id"] == rank
        assert res["plan_ops"] == res["orders"][rank]
        assert [op[:3] for op in res["executed"]] == res["plan_ops"] * ITERATIONS


def test_clock_before_each_instruction_is_the_planned_one(results: list[dict[str, Any]]) -> None:
    clocks = set()
    for res in results:
        assert res["used_version"] == res["deployed_version"] == res["plan_version"]
        planned = [step[3] for step in res["plan"]] * ITERATIONS
        assert [op[3] for op in res["executed"]] == planned
        clocks |= set(planned)
    assert len(clocks) > 1


def test_hooks_change_nothing_numerically(results: list[dict[str, Any]]) -> None:
    for res in results:
        assert len(res["hooked_losses"]) == ITERATIONS
        assert res["hooked_losses"] == res["reference_losses"]


def test_remove_restores_the_engine(results: list[dict[str, Any]]) -> None:
    for res in results:
        assert res["restored"] is True


def test_transfers_are_the_schedules(results: list[dict[str, Any]]) -> None:
    # 2 stages, one boundary: stage 0 sends activations and receives gradients, stage 1 the
    # other way round; every microbatch once per iteration on each end.
    want = sorted((0, d, m) for d in ("forward", "backward") for m in range(MICROBATCHES))
    for res in results:
        got = [(b, d, m) for b, d, m, _ in res["transfers"]]
        assert sorted(got) == sorted(want * ITERATIONS)
        assert all(0 < t[3] < 5.0 for t in res["transfers"])
        per_iteration = len(res["transfers"]) // ITERATIONS
        assert res["reported_last"] == res["transfers"][-per_iteration:]
