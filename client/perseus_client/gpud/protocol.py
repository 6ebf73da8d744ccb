"""The node daemon's wire format: length-prefixed protobuf frames on a Unix stream socket.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of one serialized
message of ``perseus_common/proto/gpud.proto``: the client sends ``Request`` frames and reads
one ``Response`` per request, in order, on one persistent connection. Frames are bounded by
:data:`MAX_FRAME` bytes in both directions; a peer that announces a longer frame is answered
with a ``TOO_LARGE`` error and disconnected, before anything of the body is read.

This module holds the codec (the blocking reader; the asyncio one, with timeouts, is
:func:`~perseus_client.gpud.limits.read_request`), the default socket location and the errors a
client sees. Both the daemon (:mod:`perseus_client.gpud.server`) and its clients
(:mod:`perseus_client.gpud.connection`) use it.
"""

from __future__ import annotations

import os
import socket
import struct

from perseus_client.errors import ClockControlUnavailableError, GpuError, GpuPermissionError
from perseus_common.proto import gpud_pb2

__all__ = [
    "DEFAULT_SOCKET",
    "SOCKET_ENV",
    "MAX_FRAME",
    "HEADER_SIZE",
    "FrameTooLargeError",
    "GpudError",
    "GpudUnavailableError",
    "GpudRefusedError",
    "GpudNotOwnerError",
    "GpudBusyError",
    "GpudLeaseHeldError",
    "GpudPermissionError",
    "encode_frame",
    "read_frame",
    "frame_size",
    "socket_path",
    "refusal",
]

#: Where the daemon listens unless ``--socket`` / ``$PERSEUS_GPUD_SOCKET`` says otherwise.
DEFAULT_SOCKET = "/run/perseus/gpud.sock"
#: The environment variable naming the daemon's socket (for both the daemon and its clients).
SOCKET_ENV = "PERSEUS_GPUD_SOCKET"
#: The largest frame body accepted, in bytes (a status of many GPUs is a few KiB).
MAX_FRAME = 65536

_HEADER = struct.Struct(">I")
#: Bytes of a frame's length header.
HEADER_SIZE = _HEADER.size


def socket_path(explicit: str | os.PathLike[str] | None = None) -> str:
    """The socket to use: ``explicit``, else ``$PERSEUS_GPUD_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    if explicit is not None:
        return os.fspath(explicit)
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


class FrameTooLargeError(ValueError):
    """A frame announced more than :data:`MAX_FRAME` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the {MAX_FRAME}-byte bound")
        self.size = size


class GpudError(GpuError):
    """Something went wrong talking to the node daemon."""


class GpudUnavailableError(GpudError, ClockControlUnavailableError):
    """The daemon cannot be reached (no socket, connection refused or closed, timeout)."""


class GpudRefusedError(GpudError):
    """The daemon answered with an error; ``code`` is the ``gpud.proto`` ``ErrorCode`` name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class GpudLeaseHeldError(GpudRefusedError, ClockControlUnavailableError):
    """Another connection (another process) holds the GPU's lease; the message names its pid."""


class GpudPermissionError(GpudRefusedError, GpuPermissionError):
    """The daemon does not allow this process's uid/gid."""


class GpudNotOwnerError(GpudRefusedError, ClockControlUnavailableError):
    """The GPU is not this process's, as far as the daemon can tell.

    No device node of it is open, no pod was given it: for a trainer that asks before CUDA
    opened its GPU, a later try succeeds.
    """


class GpudBusyError(GpudRefusedError, ClockControlUnavailableError):
    """The daemon is at its connection cap or timed the connection out: try again later."""


def refusal(error: gpud_pb2.Error) -> GpudRefusedError:
    """The client-side exception for an ``Error`` the daemon sent."""
    code = gpud_pb2.ErrorCode.Name(error.code)
    if error.code == gpud_pb2.LEASE_HELD:
        return GpudLeaseHeldError(code, error.message)
    if error.code == gpud_pb2.PERMISSION_DENIED:
        return GpudPermissionError(code, error.message)
    if error.code == gpud_pb2.NOT_OWNER:
        return GpudNotOwnerError(code, error.message)
    if error.code in (gpud_pb2.BUSY, gpud_pb2.TIMEOUT):
        return GpudBusyError(code, error.message)
    return GpudRefusedError(code, error.message)


def encode_frame(body: bytes) -> bytes:
    """``body`` with its length header (raises :class:`FrameTooLargeError` when too long)."""
    if len(body) > MAX_FRAME:
        raise FrameTooLargeError(len(body))
    return _HEADER.pack(len(body)) + body


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def frame_size(header: bytes) -> int:
    """The body length a 4-byte header announces (raises :class:`FrameTooLargeError`)."""
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameTooLargeError(size)
    return int(size)


def read_frame(sock: socket.socket) -> bytes:
    """Read one frame's body from a blocking socket (``ConnectionError`` at end of stream)."""
    size = frame_size(_recv_exactly(sock, HEADER_SIZE))
    return _recv_exactly(sock, size) if size else b""
