"""A port free on every address a host name stands for, held until the gRPC server binds it.

gRPC listens on every address its resolver gives for the host (``localhost``: ``[::1]`` and
``127.0.0.1``, whatever ``/etc/hosts`` says). Asked for port 0, it takes a free port on the first
address and then asks for the same port on the others; where another process already holds it
there (a listener, or a connection's local port), gRPC logs a warning and listens on the first
address alone. A client that dials the other address then finds nothing, or another process.

:func:`reserve_port` finds a port free on all of them and holds it with sockets that are bound
but do not listen (``SO_REUSEADDR``: the gRPC server, which sets it too, binds beside them, and
no other process can take the port meanwhile); :meth:`Reservation.release` closes them once
the gRPC server has bound.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

__all__ = ["Reservation", "grpc_addresses", "reserve_port"]

#: Where the host itself is missing (no IPv6 on this machine): the address is left out.
_NOT_HERE = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
#: How many ports are tried before it gives up.
TRIES = 50


@dataclass
class Reservation:
    """A port held on several addresses (see the module docstring)."""

    port: int
    sockets: list[socket.socket] = field(default_factory=list)

    def release(self) -> None:
        """Close the holding sockets (the gRPC server has bound the port by now)."""
        for s in self.sockets:
            s.close()
        self.sockets.clear()


def grpc_addresses(host: str) -> list[tuple[socket.AddressFamily, str]]:
    """The addresses gRPC listens on for ``host`` (empty for a wildcard: one socket)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return []
    out: list[tuple[socket.AddressFamily, str]] = []
    if host == "localhost":  # gRPC's resolver names both loopbacks
        out += [(socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")]
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
    except OSError:
        infos = []  # gRPC says why when it binds
    for family, _, _, _, addr in infos:
        item = (socket.AddressFamily(family), str(addr[0]))
        if item not in out:
            out.append(item)
    return out


def reserve_port(host: str) -> Reservation | None:
    """A port free on every address of ``host``; ``None`` when it names one address or fewer.

    Raises:
        OSError: no port was free on all of them in :data:`TRIES` tries.
    """
    addresses = grpc_addresses(host)
    if len(addresses) < 2:
        return None
    for _ in range(TRIES):
        held = _hold(addresses)
        if held is not None:
            return held
    raise OSError(f"no port free on every address of {host} ({TRIES} tried)")


def _hold(addresses: list[tuple[socket.AddressFamily, str]]) -> Reservation | None:
    """One try: the first address's free port, held on all (``None``: taken on one)."""
    res = Reservation(0)
    for family, ip in addresses:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:
            if e.errno in _NOT_HERE:
                continue
            raise
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, res.port))
        except OSError as e:
            s.close()
            if e.errno in _NOT_HERE:
                continue
            if e.errno == errno.EADDRINUSE:
                res.release()
                return None
            raise
        res.sockets.append(s)
        res.port = s.getsockname()[1]
    return res
