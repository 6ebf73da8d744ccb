"""Connection-level limits: the file-descriptor limit, an HTTP protocol that bounds open
connections and the time to send request headers, and the largest gRPC message.

A client that opens connections and never finishes its request headers holds a file descriptor
each; without a bound, enough of them exhaust the process's descriptors and every endpoint
stops answering. :func:`guarded_h11` closes a connection that has not sent a complete request
within ``header_timeout`` seconds (and after each response, the same again), and refuses
connections beyond ``max_connections``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["GRPC_MAX_MESSAGE", "guarded_h11", "raise_fd_limit"]

log = logging.getLogger("perseus.server")

#: Largest gRPC request message (a report of ``max_report_instructions`` fits several times).
GRPC_MAX_MESSAGE = 16 * 1024 * 1024


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; returns the soft limit now in force."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("cannot raise the file-descriptor limit from %d: %s", soft, e)
    return int(soft)


def guarded_h11(max_connections: int, header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a connection cap and a request-header timeout."""

    class GuardedH11(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()
                return
            self._arm()

        def _arm(self) -> None:
            cycle = self.cycle
            self.loop.call_later(header_timeout, self._expire, cycle)

        def _expire(self, cycle: Any) -> None:
            # No new request since the timer was armed, and none in progress: close.
            idle = self.cycle is cycle and (cycle is None or cycle.response_complete)
            if idle and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

    return GuardedH11
