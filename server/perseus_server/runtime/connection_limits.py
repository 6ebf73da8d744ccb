"""Connection-level limits on the file descriptors, HTTP connections and gRPC messages.

The file-descriptor limit, an HTTP protocol that bounds open connections and the time to send a
request (headers and body), and the largest gRPC message.

A client that opens connections and never finishes its request holds a file descriptor each;
without a bound, enough of them exhaust the process's descriptors and every endpoint stops
answering. :func:`guarded_h11` closes a connection that has not sent its request headers within
``header_timeout`` seconds (and after each response, the same again), or whose request body has
not all arrived ``body_timeout`` seconds after its headers (a body trickled a byte at a time).
Beyond ``max_connections``, the connection that has waited longest on an incomplete request (or
an idle one) is closed to make room, so a quick request such as ``GET /healthz`` still gets in
while slow clients fight over the cap; only when every open connection has a request being
answered is the new one refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import h11
from h11 import _readers as h11_readers
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "GRPC_MAX_MESSAGE",
    "MAX_HEAD_BYTES",
    "guarded_h11",
    "guarded_http",
    "raise_fd_limit",
    "refuse_line_folding",
]

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


def _no_line_folding(lines: Iterable[bytes]) -> Iterator[bytes]:
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise h11.LocalProtocolError("obsolete line folding in a header")
        yield line


def refuse_line_folding() -> None:
    """Make h11 refuse (400, connection closed) a request whose headers use obsolete line folding.

    RFC 9112 lets a server refuse or unfold: unfolded, ``Transfer-Encoding:`` followed by ``
    chunked`` on the next line frames the body by chunks here while a proxy that does not unfold
    sees no framing header at all (request smuggling).
    """
    h11_readers._obsolete_line_fold = _no_line_folding


class _Guard:
    """The connection cap and the timeouts of :func:`guarded_h11` and :func:`guarded_http`.

    Mixed into uvicorn's h11 or httptools protocol (both keep the request in ``self.cycle``,
    whose ``more_body`` says its body is still to come, and call ``on_response_complete``).
    """

    max_connections = 1 << 30
    header_timeout = 30.0
    body_timeout = 60.0
    _since = 0.0  # when the connection began waiting for its current request or body
    cycle: Any
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def _admit(self) -> bool:
        """Called once connected: False when the connection is over the cap and none may give way.

        Such a connection is aborted then.
        """
        self._since = self.loop.time()
        if len(self.connections) > self.max_connections and not self._evict_one():
            self.transport.abort()
            return False
        self._arm()
        return True

    def _waiting(self) -> bool:
        """Whether this connection holds a slot without a request to work on.

        That is, it has not sent a complete request (headers, or a body still arriving).
        """
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True
        return bool(cycle.more_body)

    def _evict_one(self) -> bool:
        """Close the connection (not this one) that has waited longest on an incomplete request.

        False when every other connection has a request being answered.
        """
        others = [
            c for c in self.connections if c is not self and isinstance(c, _Guard) and c._waiting()
        ]
        if not others:
            return False
        victim = min(others, key=lambda c: c._since)
        victim.transport.abort()
        self.connections.discard(victim)
        return True

    def _arm(self) -> None:
        self.loop.call_later(self.header_timeout, self._expire, self.cycle)

    def _expire(self, cycle: Any) -> None:
        # No new request since the timer was armed, and none in progress: close.
        idle = self.cycle is cycle and (cycle is None or cycle.response_complete)
        if idle and not self.transport.is_closing():
            self.transport.close()

    def _began(self, before: Any) -> None:
        """After the parser ran: start a new request's clock, and a body's timeout.

        A new request (``self.cycle`` is not ``before``) starts its clock, and a body still
        to come has ``body_timeout``.
        """
        cycle = self.cycle
        if cycle is not before and cycle is not None:
            self._since = self.loop.time()
            if cycle.more_body:
                self.loop.call_later(self.body_timeout, self._body_expire, cycle)

    def _body_expire(self, cycle: Any) -> None:
        # The request's body has not all arrived within body_timeout: close.
        late = self.cycle is cycle and cycle.more_body and not cycle.response_complete
        if late and not self.transport.is_closing():
            log.info("closing a connection whose request body is late")
            self.transport.abort()

    def _answered(self) -> None:
        self._since = self.loop.time()
        if not self.transport.is_closing():
            self._arm()


def guarded_h11(
    max_connections: int, header_timeout: float, body_timeout: float = 60.0
) -> type[H11Protocol]:
    """Uvicorn's h11 protocol with a connection cap, a request-header timeout and a body timeout.

    The body timeout is a request-body timeout. Over the cap, the connection longest waiting on
    an incomplete request gives way.
    """
    refuse_line_folding()

    class GuardedH11(_Guard, H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._admit()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            self._began(before)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._answered()

    GuardedH11.max_connections = max_connections
    GuardedH11.header_timeout, GuardedH11.body_timeout = header_timeout, body_timeout
    return GuardedH11


#: The most bytes of a request line and headers the httptools protocol reads before refusing the
#: request (h11 refuses an unfinished head past uvicorn's ``h11_max_incomplete_event_size``, the
#: same 16 KiB).
MAX_HEAD_BYTES = 16 * 1024


def guarded_http(
    max_connections: int, header_timeout: float, body_timeout: float = 60.0
) -> type[asyncio.Protocol]:
    """The HTTP protocol ``perseus serve`` runs: httptools' guarded, else :func:`guarded_h11`.

    Uvicorn's httptools protocol (llhttp, a C parser) with the guards of :func:`guarded_h11` and
    a bound on a request's head, when httptools is installed; else :func:`guarded_h11`.
    """
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return guarded_h11(max_connections, header_timeout, body_timeout)

    class GuardedHttpTools(_Guard, HttpToolsProtocol):
        _head = 0  # bytes of the current request's head read so far (-1: its head is complete)
        _completed = False  # a request completed in the bytes being parsed
        _parsed = 0  # bytes of the current request's line and headers parsed so far

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._admit()

        def data_received(self, data: bytes) -> None:
            self._completed = False
            before = self.cycle
            super().data_received(data)
            # Still in a request's head, none completed in these bytes: they all count.
            if self._head >= 0 and not self._completed and not self.transport.is_closing():
                self._head += len(data)
                if self._head > MAX_HEAD_BYTES:
                    self.send_400_response("Request line and headers too large.")
                    return
            self._began(before)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._parsed = 0

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count(self, n: int) -> None:
            # A head that arrived whole in one read: its parts count (raising in a parser
            # callback makes uvicorn answer 400 and close).
            self._parsed += n
            if self._parsed > MAX_HEAD_BYTES:
                raise ValueError("request line and headers too large")

        def on_headers_complete(self) -> None:
            self._head = -1
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head, self._completed = 0, True

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._answered()

    del httptools
    GuardedHttpTools.max_connections = max_connections
    GuardedHttpTools.header_timeout, GuardedHttpTools.body_timeout = header_timeout, body_timeout
    return GuardedHttpTools
