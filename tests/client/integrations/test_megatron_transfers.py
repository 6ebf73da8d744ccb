"""Megatron-core's P2P transfers timed by the Perseus hooks, for real.

2 gloo ranks running the calls of Megatron's 1F1B schedule (its real ``P2PCommunicator`` and
``forward_step`` / ``backward_step``; see ``megatron_worker.py`` for the one stand-in, the CUDA
device), a real offline ``PerseusClient`` per rank.

Checked: each rank records exactly the transfers 1F1B runs at its end of the one boundary
(activations and gradients of every microbatch, once per iteration), with the microbatch the
order gives; the times are positive; the client's report carries the last iteration's; removing
the hooks restores Megatron's ``P2PCommunicator``; on gloo the hooks timed them on the CPU.
With a GPU per rank, the same run over NCCL: the hooks time the transfers with CUDA events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from integration_harness import read_results, run_ranks

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

pytestmark = pytest.mark.slow

WORLD = 2
ITERATIONS = 2
MICROBATCHES = 4


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out: Path = tmp_path_factory.mktemp("megatron")
    config = {"microbatches": MICROBATCHES, "iterations": ITERATIONS}
    run_ranks("megatron_worker.py", WORLD, config, out)
    return read_results(out, "megatron", WORLD)


def test_each_end_records_the_schedules_transfers(results: list[dict[str, Any]]) -> None:
    want = sorted((0, d, mb) for d in ("forward", "backward") for mb in range(MICROBATCHES))
    for rank, res in enumerate(results):
        assert res["calls"] == [op for op in res["order"]], f"rank {rank} left the order"
        assert res["losses"] == (ITERATIONS * MICROBATCHES if rank == WORLD - 1 else 0)
        assert len(res["transfers"]) == ITERATIONS
        for recorded in res["transfers"]:
            assert sorted((b, d, mb) for b, d, mb, _ in recorded) == want
            assert all(s > 0 for *_, s in recorded)
        assert res["reported_last"] == res["transfers"][-1]
        assert res["restored"] is True
        assert res["backend"] == "gloo" and res["timers"] == ["float"], "gloo: CPU timing"


@pytest.mark.skipif(
    torch.cuda.device_count() < WORLD,
    reason=f"NCCL P2P needs a GPU per rank ({WORLD}); the CUDA-event path runs on such a machine",
)
def test_nccl_transfers_are_timed_with_cuda_events(tmp_path: Path) -> None:
    config = {"microbatches": MICROBATCHES, "iterations": ITERATIONS, "backend": "nccl"}
    run_ranks("megatron_worker.py", WORLD, config, tmp_path)
    want = sorted((0, d, mb) for d in ("forward", "backward") for mb in range(MICROBATCHES))
    for rank, res in enumerate(read_results(tmp_path, "megatron", WORLD)):
        assert res["backend"] == "nccl"
        assert res["timers"] == ["EventTiming"], f"rank {rank}: not the CUDA-event timer"
        for recorded in res["transfers"]:
            assert sorted((b, d, mb) for b, d, mb, _ in recorded) == want
            assert all(s > 0 for *_, s in recorded)
        assert res["reported_last"] == res["transfers"][-1]


def test_microbatches_follow_the_order(results: list[dict[str, Any]]) -> None:
    # Stage 0 sends activations in forward order and receives gradients in backward order;
    # stage 1 the other way round: each in microbatch order 0..3.
    for res in results:
        for recorded in res["transfers"]:
            for direction in ("forward", "backward"):
                mbs = [mb for _, d, mb, _ in recorded if d == direction]
                assert mbs == list(range(MICROBATCHES))
