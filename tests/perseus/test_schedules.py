"""Schedules: the per-rank orders written out by hand, and validation of arbitrary orders.

The orders of GPipe, 1F1B and interleaved 1F1B are written out by hand.
"""

from __future__ import annotations

import pytest

from perseus.dag import PipelineDAG
from perseus.errors import ScheduleError
from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus.schedules import Op, Schedule, gpipe, interleaved_1f1b, make_schedule, one_f_one_b


def ops(text: str, stage: int | None = None) -> tuple[Op, ...]:
    """``"F0 F1 B0"`` (on ``stage``) or ``"F0@2 B0@2"`` (model stage after ``@``)."""
    out = []
    for tok in text.split():
        kind = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}[
            tok[0]
        ]
        mb, _, st = tok[1:].partition("@")
        out.append(Op(kind, int(mb), int(st) if st else stage))
    return tuple(out)


def test_1f1b_four_stages_six_microbatches() -> None:
    # warm-up min(S - s - 1, M) = 3, 2, 1, 0 forwards; then 1F1B; then the remaining backwards
    expected = [
        "F0 F1 F2   F3 B0 F4 B1 F5 B2   B3 B4 B5",
        "F0 F1   F2 B0 F3 B1 F4 B2 F5 B3   B4 B5",
        "F0   F1 B0 F2 B1 F3 B2 F4 B3 F5 B4   B5",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
    ]
    s = one_f_one_b(4, 6)
    assert s.orders == tuple(ops(o, r) for r, o in enumerate(expected))
    assert (s.name, s.ranks, s.stages, s.microbatches, s.virtual_stages) == ("1f1b", 4, 4, 6, 1)
    assert s.num_instructions == 48
    assert make_schedule("1F1B", 4, 6).orders == s.orders


def test_1f1b_fewer_microbatches_than_stages() -> None:
    # warm-up min(3 - s, 2) = 2, 2, 1, 0
    expected = ["F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"]
    assert one_f_one_b(4, 2).orders == tuple(ops(o, r) for r, o in enumerate(expected))


def test_1f1b_one_stage_alternates() -> None:
    assert one_f_one_b(1, 3).orders == (ops("F0 B0 F1 B1 F2 B2", 0),)


def test_gpipe_two_stages_three_microbatches() -> None:
    s = gpipe(2, 3)
    assert s.orders == (ops("F0 F1 F2 B0 B1 B2", 0), ops("F0 F1 F2 B0 B1 B2", 1))
    assert s.name == "gpipe"
    assert make_schedule("gpipe", 2, 3).orders == s.orders


def test_interleaved_two_ranks_four_microbatches_two_chunks() -> None:
    # Megatron: rank r holds model stages r (chunk 0) and 2 + r (chunk 1). 8 forwards per rank;
    # the k-th forward is chunk (k % 4) // 2, microbatch (k // 4) * 2 + k % 2; backwards visit
    # the chunks in reverse. Warm-up (S - r - 1) * 2 + (V - 1) * S = 4 (rank 0) and 2 (rank 1).
    rank0 = (
        "F0@0 F1@0 F0@2 F1@2 "  # warm-up k = 0..3
        "F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 "  # forward k = 4..7, backward k = 0..3
        "B2@2 B3@2 B2@0 B3@0"  # cool-down backward k = 4..7
    )
    rank1 = (
        "F0@1 F1@1 "  # warm-up k = 0, 1
        "F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 "
        "B2@1 B3@1"
    )
    s = interleaved_1f1b(2, 4, 2)
    assert s.orders == (ops(rank0), ops(rank1))
    assert (s.ranks, s.stages, s.microbatches, s.virtual_stages) == (2, 4, 4, 2)
    assert s.stage_rank() == {0: 0, 2: 0, 1: 1, 3: 1}
    assert make_schedule("interleaved-1f1b", 2, 4, virtual_stages=2).orders == s.orders
    PipelineDAG.from_schedule(s)  # runs without deadlock


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    s = interleaved_1f1b(3, 5, 1)
    assert s.orders == one_f_one_b(3, 5).orders
    assert s.name == "interleaved-1f1b"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("pipedream", 2, 2), "unknown schedule"),
        (("1f1b", 0, 2), "stages"),
        (("gpipe", 2, 0), "microbatches"),
        (("interleaved-1f1b", 2, 3, 2), "multiple of stages"),
        (("interleaved-1f1b", 2, 4, 0), "virtual_stages"),
    ],
)
def test_make_schedule_rejects_bad_arguments(args: tuple, words: str) -> None:
    with pytest.raises(ScheduleError, match=words):
        make_schedule(*args)


def test_json_round_trip_and_dict_ops() -> None:
    s = interleaved_1f1b(2, 4, 2)
    doc = s.to_json()
    assert doc["orders"][0][:2] == [["forward", 0, 0], ["forward", 1, 0]]
    back = Schedule.from_json(doc)
    assert back == s
    # two-element ops take the rank as stage; dict ops are accepted too
    short = Schedule.from_json(
        {
            "orders": [
                [["forward", 0], {"instruction": "backward", "microbatch": 0}],
                [{"kind": "forward", "microbatch": 0, "stage": 1}, ["backward", 0, 1]],
            ]
        }
    )
    assert short.name == "custom"
    assert short.orders == one_f_one_b(2, 1).orders


def test_from_orders_accepts_zero_bubble_split_backwards() -> None:
    s = Schedule.from_orders([ops("F0 F1 I0 I1 W0 W1", 0), ops("F0 I0 F1 I1 W0 W1", 1)])
    assert (s.ranks, s.stages, s.microbatches) == (2, 2, 2)
    PipelineDAG.from_schedule(s)


@pytest.mark.parametrize(
    ("orders", "words"),
    [
        ([], "at least one rank"),
        ([ops("F0 B0", 0), ()], "rank 1 runs no instruction"),
        ([ops("F0 F0 B0", 0)], "appears twice"),
        ([ops("F0 F1 B0", 0)], "microbatch 1 needs one backward"),
        ([ops("F0 B0 I0 W0", 0)], "needs one backward"),
        ([ops("F0 I0", 0)], "needs one backward"),
        ([ops("B0", 0)], "no forward of microbatch 0"),
        ([ops("F0 F2 B0 B2", 0)], "no forward of microbatch 1"),
        ([ops("F0 B0", 0), ops("F1 B1", 0)], "stage 0 appears on ranks 0 and 1"),
        ([ops("F0 B0", 0), ops("F0 B0", 2)], r"numbered 0\.\.2"),
        ([ops("F0@0 B0@0 F0@2 B0@2"), ops("F0@1 B0@1")], "split evenly"),
        ([[("sideways", 0, 0)]], "unknown instruction 'sideways'"),
        ([[("forward", -1, 0)]], "negative"),
    ],
)
def test_from_orders_rejects_invalid_orders(orders: list, words: str) -> None:
    with pytest.raises(ScheduleError, match=words):
        Schedule.from_orders(orders)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({}, "'orders' must be a list"),
        ({"orders": ["F0"]}, r"orders\[0\] must be a list"),
        ({"orders": [[["forward"]]]}, r"orders\[0\]\[0\] must be"),
        ({"orders": [[["forward", "0", 0]]]}, "must be integers"),
        ({"orders": [[["forward", True, 0]]]}, "must be integers"),
        ({"orders": [[["forward", 0, 0], ["forward", 0, 0], ["backward", 0, 0]]]}, "twice"),
    ],
)
def test_from_json_rejects_malformed_documents(doc: dict, words: str) -> None:
    with pytest.raises(ScheduleError, match=words):
        Schedule.from_json(doc)


def test_deadlocking_order_is_rejected_when_the_dag_is_built() -> None:
    # rank 1 waits for microbatch 1's forward first; rank 0 only sends it after the backward of
    # microbatch 0, which needs rank 1 to have run microbatch 0: a cycle.
    s = Schedule.from_orders([ops("F0 B0 F1 B1", 0), ops("F1 F0 B0 B1", 1)])
    with pytest.raises(ScheduleError, match="deadlocks"):
        PipelineDAG.from_schedule(s)
    # the loss edge: a backward before its own forward on the last stage
    s2 = Schedule.from_orders([ops("F0 B0", 0), ops("B0 F0", 1)])
    with pytest.raises(ScheduleError, match="deadlocks"):
        PipelineDAG.from_schedule(s2)


def test_deadlock_also_stops_problem_building(a100: Profile) -> None:
    s = Schedule.from_orders([ops("F0 B0 F1 B1", 0), ops("F1 F0 B0 B1", 1)])
    profile = Profile({k: v for k, v in a100.entries.items() if k[0] < 2})
    with pytest.raises(ScheduleError, match="deadlocks"):
        EnergyProblem.build(profile, s, 80.0)
