"""The two context managers a training loop marks its work with.

They are ``client.iteration()`` and ``client.instruction(kind, microbatch)`` (see
:class:`~perseus_client.client.PerseusClient`).

One object of each per client, reused: iterations and instructions never nest, and the hot path
allocates nothing per instruction.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perseus_client.client import PerseusClient

__all__ = ["InstructionScope", "IterationScope"]


class IterationScope:
    """Reusable iteration context: begins and ends the client's iteration."""

    __slots__ = ("_client",)

    def __init__(self, client: PerseusClient) -> None:
        self._client = client

    def __enter__(self) -> PerseusClient:
        self._client._begin_iteration()
        return self._client

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client._end_iteration(ev)


class InstructionScope:
    """Reusable instruction context (instructions never nest, so one object per client)."""

    __slots__ = ("_client", "kind", "microbatch", "stage")

    def __init__(self, client: PerseusClient) -> None:
        self._client = client
        self.kind = "forward"
        self.microbatch = 0
        self.stage: int | None = None

    def __enter__(self) -> None:
        self._client._path.begin(self.kind, self.microbatch, self.stage)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if ev is None:
            self._client._path.end()
        else:
            self._client._path.abort()
