"""``perseus_common.kinds``: the one tuple of instruction kinds every part uses."""

from __future__ import annotations

from perseus.profiles import INSTRUCTION_KINDS as CORE_KINDS
from perseus_client.integrations import INSTRUCTION_KINDS as INTEGRATION_KINDS
from perseus_common.kinds import INSTRUCTION_KINDS


def test_every_part_uses_the_one_tuple_of_kinds() -> None:
    assert CORE_KINDS is INSTRUCTION_KINDS
    assert INTEGRATION_KINDS is INSTRUCTION_KINDS


def test_the_kinds_are_the_four_a_schedule_may_name() -> None:
    assert INSTRUCTION_KINDS == ("forward", "backward", "backward_input", "backward_weight")
