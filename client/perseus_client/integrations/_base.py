"""What every integration shares.

The client surface it drives, the order format it exports, :class:`InstructionHooks` (the client,
its instruction edges and transfer recorder, the one wrapper that runs a framework's call as
an instruction, and the context manager that removes the hooks, for every integration's hooks),
:class:`ObjectHooks` (their constructor, for hooks installed on one framework object), and :func:`quiet_stdout`: an integration never writes to stdout
(a framework's import-time warnings included), so orders printed as JSON and redirected to a file
stay JSON.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, redirect_stdout
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

from perseus_client.integrations._timing import check_mode
from perseus_common.kinds import INSTRUCTION_KINDS

__all__ = [
    "INSTRUCTION_KINDS",
    "InstructionClient",
    "InstructionEdges",
    "InstructionHooks",
    "ObjectHooks",
    "Where",
    "Orders",
    "custom_schedule",
    "check_orders",
    "quiet_stdout",
    "stdout_to_stderr",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def _stdout_handlers(out: Any) -> Iterator[logging.StreamHandler[Any]]:
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for h in lg.handlers:
            if isinstance(h, logging.StreamHandler) and h.stream in (out, sys.__stdout__):
                yield h


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While inside, what would go to stdout goes to stderr.

    ``print`` and ``sys.stdout`` writes, and log handlers that write to stdout (DeepSpeed's
    logger does: its import warns "Setting accelerator to CPU" there). Handlers created inside
    keep stderr.
    """
    out = sys.stdout
    swapped = [(h, h.stream) for h in _stdout_handlers(out)]
    for h, _ in swapped:
        h.setStream(sys.stderr)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        for h, stream in swapped:
            h.setStream(stream)


def quiet_stdout(fn: _F) -> _F:
    """Run ``fn`` under :func:`stdout_to_stderr`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with stdout_to_stderr():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


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


#: Which instruction a call is: ``(kind, microbatch, stage)``.
Where = tuple[str, int, int]

#: ``(begin(kind, microbatch, stage), end(), abort())``: what an integration calls around an
#: instruction's body (``abort`` instead of ``end`` when the body raised).
InstructionEdges = tuple[Callable[[str, int, int], None], Callable[[], None], Callable[[], None]]


def instruction_edges(client: InstructionClient) -> InstructionEdges:
    """The client's instruction edges: ``begin`` / ``end`` / ``abort``.

    ``PerseusClient``'s ``begin`` / ``end`` / ``abort`` (its hot path, no context manager), or
    the same three through ``client.instruction(...)`` for any other client.
    """
    begin, end, abort = (getattr(client, n, None) for n in ("begin", "end", "abort"))
    if callable(begin) and callable(end) and callable(abort):
        return begin, end, abort
    open_: list[AbstractContextManager[Any]] = []

    def cm_begin(kind: str, microbatch: int, stage: int) -> None:
        cm = client.instruction(kind, microbatch=microbatch, stage=stage)
        cm.__enter__()
        open_.append(cm)

    def cm_end() -> None:
        open_.pop().__exit__(None, None, None)

    def cm_abort() -> None:
        if open_:
            open_.pop().__exit__(*sys.exc_info())

    return cm_begin, cm_end, cm_abort


class InstructionHooks:
    """The base of every integration's hooks: what they drive, and the wrapper they all call.

    Args:
        client: the client whose instruction edges wrap each instruction (a
            :class:`InstructionClient`; ``PerseusClient``'s hot-path ``begin`` / ``end`` /
            ``abort`` when it has them).
        transfers: whether P2P transfers are timed, if the client can record them.
        transfer_timing: how they are timed (``auto``, ``cpu`` or ``events``).

    Attributes:
        client: the client driven by the hooks.
        transfer_timing: the checked timing mode.
        transfers: whether P2P transfers are timed (the client has ``record_transfer`` and
            ``transfers`` was not ``False``).
    """

    def __init__(
        self, client: InstructionClient, *, transfers: bool = True, transfer_timing: str = "auto"
    ) -> None:
        self.transfer_timing = check_mode(transfer_timing)
        self.client = client
        self._edges = instruction_edges(client)
        record = getattr(client, "record_transfer", None)
        self._record: Callable[[int, str, int, Any], None] | None = (
            record if transfers and callable(record) else None
        )
        self.transfers = self._record is not None
        #: Whether the wrapped instructions drive the client now (each integration says when).
        self._active = True

    def wrap_instruction(
        self, body: Callable[..., Any], locate: Callable[[tuple[Any, ...], dict[str, Any]], Where]
    ) -> Callable[..., Any]:
        """``body`` wrapped to run as one instruction of the plan while the hooks are active.

        ``locate(args, kwargs)`` says which instruction a call is, from the call's arguments or
        the hook's own bookkeeping (a counter, the order's next entry): ``(kind, microbatch,
        stage)``. The client's ``begin`` runs before the body (the clock is set), ``end`` after,
        ``abort`` instead when the body raises (the exception goes on). While the hooks are
        inactive (an evaluation step, outside an iteration) the body runs bare. The wrapper is
        marked ``_perseus_hook`` (and ``_perseus_owner``: these hooks).
        """
        begin, end, abort = self._edges

        @functools.wraps(body)
        def instruction(*args: Any, **kwargs: Any) -> Any:
            if not self._active:
                return body(*args, **kwargs)
            kind, microbatch, stage = locate(args, kwargs)
            begin(kind, microbatch, stage)
            try:
                out = body(*args, **kwargs)
            except BaseException:
                abort()
                raise
            end()
            return out

        instruction._perseus_hook = True  # type: ignore[attr-defined]
        instruction._perseus_owner = self  # type: ignore[attr-defined]
        return instruction

    def remove(self) -> None:
        """Undo what the integration installed; safe to call twice (each integration says how)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class ObjectHooks(InstructionHooks):
    """Hooks installed on one framework object (a DeepSpeed engine, a torch schedule).

    Args:
        target: the object the hooks go on (each integration names it too: ``engine``,
            ``schedule``).
        client: as :class:`InstructionHooks`.
        transfers: as :class:`InstructionHooks`.
        transfer_timing: as :class:`InstructionHooks`.

    Attributes:
        target: the instrumented object.
    """

    def __init__(
        self,
        target: Any,
        client: InstructionClient,
        *,
        transfers: bool = True,
        transfer_timing: str = "auto",
    ) -> None:
        super().__init__(client, transfers=transfers, transfer_timing=transfer_timing)
        self.target = target
        self._prepare()

    def _prepare(self) -> None:
        """Set up the integration's own bookkeeping (nothing is installed yet)."""


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
