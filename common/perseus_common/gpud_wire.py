"""The node daemon's wire format: length-prefixed protobuf frames on a Unix stream socket.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of one serialized
message of ``perseus_common/proto/gpud.proto``: the client sends ``Request`` frames and reads
one ``Response`` per request, in order, on one persistent connection. Frames are bounded by
:data:`MAX_FRAME` bytes in both directions; a peer that announces a longer frame is answered
with a ``TOO_LARGE`` error and disconnected, before anything of the body is read.

This module holds the codec (the blocking reader; the daemon's asyncio one, with timeouts, is
``perseus_gpud.limits.read_request``) and the default socket location, written once for both
ends: the daemon (``perseus_gpud``) and its clients
(:mod:`perseus_client.gpu.daemon_connection`, whose errors are what a client sees).
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = [
    "DEFAULT_SOCKET",
    "SOCKET_ENV",
    "MAX_FRAME",
    "HEADER_SIZE",
    "FrameTooLargeError",
    "encode_frame",
    "read_frame",
    "frame_size",
    "socket_path",
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
