"""The built-in pipeline orders as plain lists: what each rank runs, in order.

An order is ``orders[rank] = [(kind, microbatch, model_stage), ...]``. :mod:`perseus.schedules`
validates sizes and wraps these in a ``Schedule``; the rank client's integrations use them as they
are, to tell the server what a framework's schedule runs without importing the scheduler.

* :func:`gpipe_orders` — every forward, then every backward, in microbatch order.
* :func:`one_f_one_b_orders` — 1F1B (PipeDream-Flush) as Megatron-LM and DeepSpeed run it: rank
  ``s`` runs ``min(S - s - 1, M)`` warm-up forwards, then alternates one forward and one backward,
  then drains the remaining backwards.
* :func:`interleaved_1f1b_orders` — Megatron-LM's interleaved 1F1B with ``V`` model chunks per rank
  (rank ``s`` holds model stages ``v * S + s``; microbatches go through the chunks in groups of
  ``S``, so ``M`` must be a multiple of ``S``).
"""

from __future__ import annotations

__all__ = ["Orders", "gpipe_orders", "one_f_one_b_orders", "interleaved_1f1b_orders"]

#: ``orders[rank]`` is that rank's ``(kind, microbatch, model stage)`` in execution order.
Orders = list[list[tuple[str, int, int]]]


def gpipe_orders(stages: int, microbatches: int) -> Orders:
    """GPipe on ``stages`` ranks: all forwards, then all backwards (as torch's ScheduleGPipe)."""
    return [
        [("forward", m, s) for m in range(microbatches)]
        + [("backward", m, s) for m in range(microbatches)]
        for s in range(stages)
    ]


def one_f_one_b_orders(stages: int, microbatches: int) -> Orders:
    """1F1B on ``stages`` ranks, one model stage each."""
    orders: Orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order = [("forward", m, s) for m in range(warmup)]
        for i in range(microbatches - warmup):
            order.append(("forward", warmup + i, s))
            order.append(("backward", i, s))
        order += [("backward", m, s) for m in range(microbatches - warmup, microbatches)]
        orders.append(order)
    return orders


def interleaved_1f1b_orders(stages: int, microbatches: int, virtual_stages: int) -> Orders:
    """Interleaved 1F1B on ``stages`` ranks with ``virtual_stages`` chunks each.

    ``microbatches`` must be a multiple of ``stages`` when ``virtual_stages > 1`` (the caller
    checks); with one chunk it is :func:`one_f_one_b_orders`.
    """
    if virtual_stages == 1:
        return one_f_one_b_orders(stages, microbatches)
    V, S = virtual_stages, stages
    total = microbatches * V
    group = S * V

    def op(k: int, forward: bool, rank: int) -> tuple[str, int, int]:
        in_group = k % group
        chunk = in_group // S
        if not forward:
            chunk = V - chunk - 1
        mb = (k // group) * S + in_group % S
        return ("forward" if forward else "backward", mb, chunk * S + rank)

    orders: Orders = []
    for s in range(S):
        warmup = min((S - s - 1) * 2 + (V - 1) * S, total)
        order = [op(k, True, s) for k in range(warmup)]
        for i in range(total - warmup):
            order.append(op(warmup + i, True, s))
            order.append(op(i, False, s))
        order += [op(k, False, s) for k in range(total - warmup, total)]
        orders.append(order)
    return orders
