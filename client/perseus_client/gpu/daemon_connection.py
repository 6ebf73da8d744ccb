"""A blocking client connection to the node daemon (used by ``DaemonGpu`` and ``gpud status``).

:class:`GpudConnection` opens the Unix socket and makes one call at a time (a lock serialises
callers from several threads: the clock thread and the heartbeat thread share one connection,
because the connection is the lease). Every call has a timeout; any I/O failure closes the
connection and raises :class:`~perseus_client.errors.GpudUnavailableError`, a refusal by
the daemon raises a :class:`~perseus_client.errors.GpudRefusedError` (:func:`refusal` picks
its kind; the connection stays usable). The frames are :mod:`perseus_common.gpud_wire`'s, the
messages ``gpud.proto``'s: the client needs nothing of the daemon's package.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from perseus_client.errors import (
    GpudBusyError,
    GpudLeaseHeldError,
    GpudNotOwnerError,
    GpudPermissionError,
    GpudRefusedError,
    GpudUnavailableError,
)
from perseus_common.gpud_wire import encode_frame, read_frame, socket_path
from perseus_common.proto import gpud_pb2

__all__ = ["GpudConnection", "refusal"]


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


class GpudConnection:
    """One persistent connection to ``perseus gpud`` (see the module docstring).

    Args:
        path: the daemon's socket (default ``$PERSEUS_GPUD_SOCKET`` or ``/run/perseus/gpud.sock``).
        timeout: seconds a call may take before the connection is given up.
    """

    def __init__(self, path: str | None = None, *, timeout: float = 5.0) -> None:
        self.path = socket_path(path)
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._next_id = 0
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise GpudUnavailableError(
                f"cannot reach the Perseus node daemon at {self.path}: {exc.strerror or exc} "
                "(is `perseus gpud` running, and may this user open its socket?)"
            ) from exc
        self._sock: socket.socket | None = sock

    @property
    def closed(self) -> bool:
        """True once the connection was closed (by :meth:`close` or a failure)."""
        return self._sock is None

    def call(self, **call: Any) -> gpud_pb2.Response:
        """Send one request (``call`` is its single ``oneof`` field) and return the response."""
        # A bounded wait: a signal handler that resets clocks may interrupt a call on the same
        # thread; it then fails (and the caller drops the connection, which resets the GPU).
        if not self._lock.acquire(timeout=self.timeout):
            raise GpudUnavailableError(f"the connection to {self.path} stayed busy")
        try:
            sock = self._sock
            if sock is None:
                raise GpudUnavailableError(f"the connection to {self.path} is closed")
            self._next_id += 1
            request = gpud_pb2.Request(id=self._next_id, **call)
            try:
                sock.sendall(encode_frame(request.SerializeToString()))
                response = gpud_pb2.Response.FromString(read_frame(sock))
            except (OSError, ValueError) as exc:  # timeouts, resets, EOF, bad frames
                self._close_locked()
                raise GpudUnavailableError(
                    f"lost the connection to the Perseus node daemon at {self.path}: {exc}"
                ) from exc
        finally:
            self._lock.release()
        if response.HasField("error"):
            raise refusal(response.error)
        return response

    def _close_locked(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        """Close the connection (the daemon releases and resets this connection's GPUs)."""
        with self._lock:
            self._close_locked()

    def abort(self) -> None:
        """Close the socket without waiting for a call in flight (it fails with unavailable)."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> GpudConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
