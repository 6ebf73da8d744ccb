"""The solve slots shared between tenants in turn (``runtime/fair_slots.py``)."""

from __future__ import annotations

import asyncio

import pytest

from perseus_server.runtime.fair_slots import FairSlots


def test_slots_go_to_the_tenants_in_turn() -> None:
    async def run() -> list[str]:
        slots, order = FairSlots(1), []
        assert slots.acquire("b").done()
        # b holds the slot and queues three more; a and c come later.
        for t in ("b", "b", "b", "a", "c", "a"):
            slots.acquire(t).add_done_callback(lambda f, t=t: order.append(t))
        holder = "b"
        for _ in range(6):
            slots.release(holder)
            await asyncio.sleep(0)  # the waiter's callback runs
            holder = order[-1]
        return order

    assert asyncio.run(run()) == ["b", "a", "c", "b", "a", "b"]  # FIFO: b, b, b, a, c, a


def test_a_withdrawn_waiter_gives_its_turn_on() -> None:
    async def run() -> None:
        slots = FairSlots(1)
        first = slots.acquire("b")
        gone, next_ = slots.acquire("b"), slots.acquire("a")
        slots.withdraw("b", gone)
        assert slots.waiting() == 1
        slots.release("b")
        assert next_.done() and first.done() and slots.running("a") == 1
        slots.withdraw("a", next_)  # a slot given: released
        assert slots.running("a") == 0 and slots.acquire("c").done()

    asyncio.run(run())


def test_a_negative_number_of_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="slots: must be >= 0, got -1"):
        FairSlots(-1)
