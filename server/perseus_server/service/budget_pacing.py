"""The pace of the power budget's recomputations that jobs cause (``Limits.budget_recompute_seconds``).

The first change recomputes at once; more within the interval of the last such recomputation
wait, merged, and are recomputed once at its end (a timer on the event loop; without a running
loop, at once). A recomputation made meanwhile for another reason (the admin's) covers the
changes merged so far: :meth:`Pacer.covered` drops the pending one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

__all__ = ["Pacer"]

log = logging.getLogger("perseus.server")


class Pacer:
    """Merges requests to ``run(cause, skip)`` to one per ``interval()`` seconds."""

    def __init__(
        self, interval: Callable[[], float], run: Callable[[str, str | None], None]
    ) -> None:
        self.interval, self.run = interval, run
        self._last = -math.inf
        self._pending: asyncio.TimerHandle | None = None
        self._causes: list[str] = []  # the first and the last merged
        self._merged = 0

    def request(self, cause: str, skip: str | None = None) -> None:
        """Run for ``cause`` now (``skip`` handed on) or, within the interval, at its end."""
        self._causes.append(cause)
        del self._causes[1:-1]
        self._merged += 1
        if self._pending is not None:
            return
        wait = self._last + self.interval() - time.monotonic()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            wait = 0.0
        if wait <= 0:
            self._fire(skip)
            return
        self._pending = loop.call_later(wait, self._fire)

    def covered(self) -> None:
        """A recomputation ran: every change merged so far is in it."""
        if self._pending is not None:
            self._pending.cancel()
        self._pending, self._causes, self._merged = None, [], 0

    def _fire(self, skip: str | None = None) -> None:
        causes, merged = self._causes, self._merged
        if not causes:
            self._pending = None
            return
        cause = causes[0] if merged == 1 else f"{causes[-1]} (and {merged - 1} more)"
        self._last = time.monotonic()
        try:
            self.run(cause, skip)
        except Exception:  # a timer must never take the loop down
            log.exception("power budget: recomputation failed (%s)", cause)
