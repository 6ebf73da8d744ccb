"""Rate-limited logging: a flood of the same line must not fill the disk.

A flood such as a client retrying an error in a loop, or a resource exhausted on every accept.

:class:`RateLimit` is a :class:`logging.Filter` keyed by the record's logger, level and message
template: at most ``burst`` records per key pass in any ``window`` seconds; the first record
after a suppressed stretch says how many were dropped. Memory is bounded by ``max_keys``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["RateLimit", "install_rate_limit"]


class RateLimit(logging.Filter):
    """At most ``burst`` records per (logger, level, template) in each ``window`` seconds."""

    def __init__(
        self,
        burst: int = 20,
        window: float = 60.0,
        *,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.burst, self.window, self.max_keys, self.clock = burst, window, max_keys, clock
        # key -> [window start, records passed in it, records dropped in it]
        self._seen: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to pass ``record``: at most ``burst`` of the same line per ``window`` seconds.

        The first record of a new window says how many similar lines were suppressed in the
        last.
        """
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        slot = self._seen.get(key)
        if slot is None or now - slot[0] >= self.window:
            dropped = 0 if slot is None else int(slot[2])
            slot = [now, 0.0, 0.0]
            self._seen[key] = slot
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)
            if dropped:
                record.msg = f"{record.msg} [{dropped} similar lines suppressed]"
        if slot[1] >= self.burst:
            slot[2] += 1
            return False
        slot[1] += 1
        return True


def install_rate_limit(logger: logging.Logger | None = None, **kwargs: float) -> RateLimit:
    """Attach one :class:`RateLimit` to every handler of ``logger`` (default: the root)."""
    limit = RateLimit(**kwargs)  # type: ignore[arg-type]
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(limit)
    return limit
