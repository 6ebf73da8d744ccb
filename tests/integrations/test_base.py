"""The order format every integration exports."""

from __future__ import annotations

import pytest

from perseus.schedules import Schedule
from perseus_client.integrations import custom_schedule


def test_custom_schedule_is_what_the_server_and_core_accept() -> None:
    orders = [[["forward", 0, 0], ["backward", 0, 0]], [["forward", 0, 1], ["backward", 0, 1]]]
    doc = custom_schedule(orders)
    assert doc == {"name": "custom", "orders": orders}
    assert Schedule.from_json(doc).ranks == 2


@pytest.mark.parametrize(
    ("orders", "message"),
    [
        ([], "at least one rank"),
        ([[["forwards", 0, 0]]], r"orders\[0\]\[0\]"),
        ([[["forward", 0]]], r"orders\[0\]\[0\]"),
        ([[["forward", "0", 0]]], "integers"),
    ],
)
def test_bad_orders_are_named(orders: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        custom_schedule(orders)
