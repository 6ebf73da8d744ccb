"""The torch.distributed.pipelining hooks time the P2P transfers the schedule really runs.

2 gloo ranks, a real ``PerseusClient`` (offline) on a recording ``SimulatedGpu`` per rank.

Checked per schedule: every rank records exactly the transfers its stages exchange with a stage
on the other rank (boundary, direction, microbatch), once per iteration each, and none between two
stages of one rank; every transfer is recorded by both of its ends; the times are positive and
below the iteration's; the client's iteration report carries them; nothing is recorded once the
hooks are removed. With the receiver of
microbatch 0's activations late by 0.3 s, the sender's time of that transfer covers the wait and
the receiver's does not (the smaller of the two ends' values is the transfer, see
``perseus_client.integrations._torch_p2p``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from integration_harness import read_results, run_ranks

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCHEDULES = ["Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble"]
WORLD = 2
ITERATIONS = 3
MICROBATCHES = 4
DELAY = 0.3


def expected(indices: list[int], total: int) -> Counter[tuple[int, str, int]]:
    """The transfers one iteration of a rank holding model stages ``indices`` runs."""
    out: Counter[tuple[int, str, int]] = Counter()
    for s in indices:
        for m in range(MICROBATCHES):
            if s + 1 < total and s + 1 not in indices:
                out[(s, "forward", m)] += 1  # sends activations, receives gradients
                out[(s, "backward", m)] += 1
            if s > 0 and s - 1 not in indices:
                out[(s - 1, "forward", m)] += 1  # receives activations, sends gradients
                out[(s - 1, "backward", m)] += 1
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out: Path = tmp_path_factory.mktemp("transfers")
    config = {
        "schedules": SCHEDULES,
        "microbatches": MICROBATCHES,
        "iterations": ITERATIONS,
        "delay": DELAY,
    }
    run_ranks("transfer_worker.py", WORLD, config, out)
    return {name: read_results(out, name, WORLD) for name in SCHEDULES}


@pytest.mark.parametrize("name", SCHEDULES)
def test_recorded_transfers_are_the_schedules(results: dict[str, Any], name: str) -> None:
    keys_by_rank = []
    for rank, res in enumerate(results[name]):
        want = expected(res["indices"], res["total"])
        assert want, f"rank {rank}: the test's pipeline has no cross-rank transfer"
        assert len(res["transfers"]) == ITERATIONS
        for i, recorded in enumerate(res["transfers"]):
            got = Counter((b, d, m) for b, d, m, _ in recorded)
            assert got == want, f"rank {rank}, iteration {i}: recorded {got}, expected {want}"
        assert res["after_remove"] == []
        # The client's iteration report carries exactly what the hooks recorded.
        assert res["reported"] == res["transfers"]
        keys_by_rank.append(set(want))
    # Each transfer has two ends, on different ranks.
    assert keys_by_rank[0] == keys_by_rank[1]


def test_a_stage_pair_on_one_rank_records_nothing(results: dict[str, Any]) -> None:
    # ZBV holds stages (0, 3) and (1, 2): boundary 1 is inside rank 1.
    for res in results["ScheduleZBVZeroBubble"]:
        assert not [t for it in res["transfers"] for t in it if t[0] == 1]
        assert {t[0] for it in res["transfers"] for t in it} == {0, 2}


@pytest.mark.parametrize("name", SCHEDULES)
def test_times_are_plausible(results: dict[str, Any], name: str) -> None:
    for res in results[name]:
        for recorded in res["transfers"][:-1]:  # the last iteration has the injected delay
            assert all(0 < s < 5.0 for *_, s in recorded)


@pytest.mark.parametrize("name", ["Schedule1F1B", "ScheduleInterleaved1F1B"])
def test_a_late_receiver_shows_on_the_senders_end_only(results: dict[str, Any], name: str) -> None:
    sender, receiver = results[name]
    last = {(b, d, m): s for b, d, m, s in sender["transfers"][-1]}
    late = {(b, d, m): s for b, d, m, s in receiver["transfers"][-1]}
    key = (0, "forward", 0)
    assert last[key] >= 0.8 * DELAY, f"the sender waited {last[key]:.3f} s for a late receiver"
    assert late[key] < 0.5 * DELAY, f"the late receiver measured {late[key]:.3f} s"
    assert min(last[key], late[key]) < 0.5 * DELAY
