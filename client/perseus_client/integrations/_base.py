"""What every integration shares: the client surface it drives and the order format it exports."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from perseus_common.kinds import INSTRUCTION_KINDS

__all__ = ["INSTRUCTION_KINDS", "InstructionClient", "Orders", "custom_schedule", "check_orders"]

#: Per-rank instruction orders: ``orders[rank] == [[kind, microbatch, stage], ...]``.
Orders = list[list[list[Any]]]


@runtime_checkable
class InstructionClient(Protocol):
    """The two context managers an integration calls (``PerseusClient`` provides both).

    ``iteration()`` wraps one training iteration (a plan update is applied at its start);
    ``instruction(kind, microbatch=m, stage=s)`` wraps one forward / backward / backward_input /
    backward_weight of microbatch ``m`` on model stage ``s`` (the clock is set on entry).
    """

    def iteration(self) -> AbstractContextManager[Any]: ...

    def instruction(
        self, kind: str, *, microbatch: int, stage: int
    ) -> AbstractContextManager[Any]: ...


def check_orders(orders: Orders) -> Orders:
    """Validate the shape of exported orders; return them unchanged."""
    if not orders:
        raise ValueError("orders: at least one rank is needed")
    for r, order in enumerate(orders):
        for i, op in enumerate(order):
            if len(op) != 3 or op[0] not in INSTRUCTION_KINDS:
                raise ValueError(
                    f"orders[{r}][{i}]: expected [kind, microbatch, stage], got {op!r}"
                )
            if not isinstance(op[1], int) or not isinstance(op[2], int):
                raise ValueError(f"orders[{r}][{i}]: microbatch and stage must be integers")
    return orders


def custom_schedule(orders: Orders) -> dict[str, Any]:
    """The job's ``schedule`` field for explicit orders: ``{"name": "custom", "orders": ...}``."""
    return {"name": "custom", "orders": check_orders(orders)}
