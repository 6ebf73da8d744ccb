"""A least-recently-used cache bounded in bytes (and in entries).

Each entry's cost is given by a ``size`` function (for ``bytes`` values, their length); the
cache evicts from the least recently used end until both bounds hold. Lookups and inserts are
O(1) amortised. An entry larger than the whole budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ByteBoundedCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteBoundedCache(Generic[K, V]):
    """LRU map holding at most ``max_bytes`` (as ``size`` counts them) and ``max_entries``."""

    def __init__(
        self, max_bytes: int, size: Callable[[V], int], *, max_entries: int = 1 << 20
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._size = size
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        hit = self._data.get(key)
        if hit is None:
            return None
        self._data.move_to_end(key)
        return hit[0]

    def __setitem__(self, key: K, value: V) -> None:
        cost = max(0, int(self._size(value)))
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if cost > self.max_bytes:
            return
        self._data[key] = (value, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes or len(self._data) > self.max_entries:
            _, (_, c) = self._data.popitem(last=False)
            self.bytes -= c

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def clear(self) -> None:
        """Drop every entry."""
        self._data.clear()
        self.bytes = 0
