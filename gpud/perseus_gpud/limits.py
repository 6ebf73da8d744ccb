"""The daemon's connection limits: how many connections, from whom, idle for how long.

A peer that can open the socket but may not lease (the socket's group is wider than the allowed
uids/gids, or a member misbehaves) must not lock trainers out by holding connections open. So:

- the soft limit on open files is raised to the hard limit at start (:func:`raise_fd_limit`);
- at most ``max_connections`` connections in all, and ``max_per_uid`` from one uid (root is
  exempt from the per-uid cap); the last ``reserved`` of the total are kept for peers allowed to
  lease, so idle connections of others can never take the slot a trainer needs;
- a connection that holds no lease and sends no request for ``idle_timeout`` seconds is closed
  (a leasing one is governed by the lease timeout instead), and a frame must be complete within
  ``frame_timeout`` seconds of its first byte.

A connection over a limit is answered with one ``BUSY`` error frame and closed; a timed-out one
with ``TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass

from perseus_common.gpud_wire import HEADER_SIZE, frame_size

__all__ = ["ConnectionLimits", "ConnectionTimeout", "raise_fd_limit", "read_request"]

log = logging.getLogger("perseus_gpud")


@dataclass(frozen=True)
class ConnectionLimits:
    """See the module docstring."""

    max_connections: int = 512
    max_per_uid: int = 64
    reserved: int = 32
    idle_timeout: float = 60.0
    frame_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {self.max_connections}")
        if self.max_per_uid < 1:
            raise ValueError(f"max_per_uid: must be >= 1, got {self.max_per_uid}")
        if not 0 <= self.reserved < self.max_connections:
            raise ValueError(
                f"reserved: must be >= 0 and below max_connections ({self.max_connections}), "
                f"got {self.reserved}"
            )
        if not self.idle_timeout > 0 or not self.frame_timeout > 0:
            raise ValueError("idle_timeout, frame_timeout: must be > 0 seconds")

    def refusal(self, total: int, from_uid: int, uid: int, allowed: bool) -> str | None:
        """Why a new connection must be refused (``None``: admit it).

        Given ``total`` open connections and ``from_uid`` of them from the peer's ``uid``.
        """
        if total >= self.max_connections:
            return f"the daemon has {total} connections, its limit (--max-connections)"
        if not allowed and total >= self.max_connections - self.reserved:
            return (
                f"the last {self.reserved} of {self.max_connections} connections are kept for "
                "peers allowed to lease (--reserved-connections)"
            )
        if uid != 0 and from_uid >= self.max_per_uid:
            return f"uid {uid} has {from_uid} connections, the per-uid limit (--max-connections-per-uid)"
        return None


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit; return ``(soft, hard)`` after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard or hard == resource.RLIM_INFINITY:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, hard


class ConnectionTimeout(Exception):
    """A connection was idle too long, or did not complete a frame in time.

    The message says which, naming the option.
    """


async def read_request(
    reader: asyncio.StreamReader, idle: float | None, frame_timeout: float
) -> bytes:
    """One frame's body, read within the time limits.

    The first byte may take ``idle`` seconds (``None``: no limit, for a leasing connection,
    which the lease timeout governs), the rest ``frame_timeout`` seconds. Raises
    :class:`ConnectionTimeout`, ``FrameTooLargeError``, or ``asyncio.IncompleteReadError`` at
    end of stream.
    """
    try:
        first = await asyncio.wait_for(reader.readexactly(1), idle)
    except TimeoutError:
        raise ConnectionTimeout(f"idle for {idle:.0f} s without a lease (--idle-timeout)") from None
    try:
        header = first + await asyncio.wait_for(reader.readexactly(HEADER_SIZE - 1), frame_timeout)
        size = frame_size(header)
        if not size:
            return b""
        return await asyncio.wait_for(reader.readexactly(size), frame_timeout)
    except TimeoutError:
        raise ConnectionTimeout(
            f"a frame was not completed within {frame_timeout:g} s (--frame-timeout)"
        ) from None
