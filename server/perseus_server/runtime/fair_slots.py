"""Worker slots shared fairly between tenants: per-tenant queues served in turn.

The solve manager (:mod:`perseus_server.runtime.solve_manager`) runs at most ``n`` solves at
once. Who gets a slot that frees is decided here: every tenant waiting has a queue of its own
(first come, first served within it), and the tenants are served in turn (round robin over the
tenants with a solve waiting, in the order they first queued). So a tenant's single solve
waits for at most one slot to free, however many solves another tenant queued before it; a
free slot is never left idle while any solve waits (work conserving).

A slot once given is held until :meth:`FairSlots.release`: a running solve is never stopped
for another tenant's.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque

__all__ = ["FairSlots"]


class FairSlots:
    """``n`` slots; tenants' waiters served in turn (see the module docstring)."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"slots: must be >= 0, got {n}")
        self._free = n
        #: Per tenant with a waiter, its waiters in arrival order; the dict's order is the
        #: round robin's (the tenant served last moves to the end).
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._running: dict[str, int] = {}

    def waiting(self, tenant: str | None = None) -> int:
        """Waiters of ``tenant`` (None: of every tenant)."""
        if tenant is not None:
            return len(self._queues.get(tenant, ()))
        return sum(len(q) for q in self._queues.values())

    def running(self, tenant: str) -> int:
        """Slots ``tenant`` holds."""
        return self._running.get(tenant, 0)

    def acquire(self, tenant: str) -> asyncio.Future[None]:
        """A future that resolves once ``tenant`` holds a slot (at once when one is free).

        Cancel it (or :meth:`withdraw` it) to stop waiting; once resolved, the slot is held
        until :meth:`release`.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._free > 0 and not self._queues:
            self._free -= 1
            self._running[tenant] = self._running.get(tenant, 0) + 1
            fut.set_result(None)
            return fut
        self._queues.setdefault(tenant, deque()).append(fut)
        return fut

    def withdraw(self, tenant: str, fut: asyncio.Future[None]) -> None:
        """Stop waiting; a slot already given through ``fut`` is released."""
        if fut.done() and not fut.cancelled():
            self.release(tenant)
            return
        fut.cancel()
        q = self._queues.get(tenant)
        if q is not None and fut in q:
            q.remove(fut)
            if not q:
                del self._queues[tenant]

    def release(self, tenant: str) -> None:
        """``tenant`` gives a slot back: the next tenant in turn with a waiter gets it."""
        left = self._running.get(tenant, 0) - 1
        if left > 0:
            self._running[tenant] = left
        else:
            self._running.pop(tenant, None)
        self._free += 1
        self._hand_on()

    def _hand_on(self) -> None:
        while self._free > 0 and self._queues:
            tenant, q = next(iter(self._queues.items()))
            fut = q.popleft()
            if q:
                self._queues.move_to_end(tenant)  # its turn is over: the others' next
            else:
                del self._queues[tenant]
            if fut.cancelled():
                continue
            self._free -= 1
            self._running[tenant] = self._running.get(tenant, 0) + 1
            fut.set_result(None)
