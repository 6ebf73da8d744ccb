"""``perseus_common.orders``: the built-in pipeline orders as plain lists, one per rank."""

from __future__ import annotations

from collections import Counter

import pytest

from perseus_common.orders import gpipe_orders, interleaved_1f1b_orders, one_f_one_b_orders


def test_gpipe_runs_every_forward_then_every_backward() -> None:
    assert gpipe_orders(2, 2) == [
        [("forward", 0, 0), ("forward", 1, 0), ("backward", 0, 0), ("backward", 1, 0)],
        [("forward", 0, 1), ("forward", 1, 1), ("backward", 0, 1), ("backward", 1, 1)],
    ]


def test_1f1b_warms_up_then_alternates_then_drains() -> None:
    orders = one_f_one_b_orders(3, 4)
    assert [(k[0], m) for k, m, _ in orders[0]] == [
        ("f", 0), ("f", 1), ("f", 2), ("b", 0), ("f", 3), ("b", 1), ("b", 2), ("b", 3)
    ]  # fmt: skip
    last = orders[2]  # no warm-up on the last stage: forward, backward, ...
    assert [k[0] for k, _, _ in last] == list("fbfbfbfb")
    assert {s for order in orders for _, _, s in order[:1]} == {0, 1, 2}


@pytest.mark.parametrize(("stages", "microbatches"), [(1, 1), (2, 1), (4, 2), (4, 8)])
def test_each_rank_runs_each_instruction_once_forward_before_backward(
    stages: int, microbatches: int
) -> None:
    for build in (gpipe_orders, one_f_one_b_orders):
        for s, order in enumerate(build(stages, microbatches)):
            expected = {(k, m, s) for k in ("forward", "backward") for m in range(microbatches)}
            assert Counter(order) == Counter(expected)
            for m in range(microbatches):
                assert order.index(("forward", m, s)) < order.index(("backward", m, s))


def test_interleaving_with_one_chunk_is_1f1b() -> None:
    assert interleaved_1f1b_orders(4, 8, 1) == one_f_one_b_orders(4, 8)


@pytest.mark.parametrize(("stages", "microbatches", "chunks"), [(2, 2, 2), (2, 4, 3), (4, 8, 2)])
def test_interleaved_ranks_run_their_chunks_model_stages(
    stages: int, microbatches: int, chunks: int
) -> None:
    orders = interleaved_1f1b_orders(stages, microbatches, chunks)
    for s, order in enumerate(orders):
        mine = [v * stages + s for v in range(chunks)]  # rank s holds stages v * S + s
        expected = {
            (k, m, st) for k in ("forward", "backward") for m in range(microbatches) for st in mine
        }
        assert Counter(order) == Counter(expected)
        for m in range(microbatches):
            for st in mine:
                assert order.index(("forward", m, st)) < order.index(("backward", m, st))
    # On a rank, a microbatch's forwards go through its chunks in order, its backwards in reverse.
    for s, order in enumerate(orders):
        for m in range(microbatches):
            for v in range(1, chunks):
                lower, upper = (v - 1) * stages + s, v * stages + s
                assert order.index(("forward", m, lower)) < order.index(("forward", m, upper))
                assert order.index(("backward", m, upper)) < order.index(("backward", m, lower))
