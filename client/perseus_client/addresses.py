"""The server addresses a rank is given, and the order it tries them in to find the leader.

A rank may be given several addresses (``PERSEUS_SERVER=a:50051,b:50051``, or
``server=["a:50051", "grpcs://b:50051"]``): the servers of an active/standby pair. Each address
is ``host:port``, ``grpc://host:port`` or ``grpcs://host:port`` (TLS for that address), or a
gRPC resolver target (``unix:path``, ``dns:///name:port``); :func:`parse_servers` checks them
all and raises :class:`~perseus_client.errors.ConfigError` naming the one at fault and why.

A host name that resolves to several addresses counts as several: :class:`Route` resolves the
names each time it starts a round over the list (so a changed DNS record is followed), dials each
address of the name in turn, and keeps the name as the TLS and HTTP/2 authority (the server's
certificate names the name, not its addresses). A name that does not resolve is kept as it is:
gRPC resolves it when it connects, and an address that cannot be reached is skipped like any
other. The resolver can be injected (tests; a resolver of one's own).

:class:`Route` is what :class:`~perseus_client.transport.ServerLink` follows: the address it
uses now, the next one when a server is unreachable or answers that it is a standby, and the
leader's address when a standby names it (tried next, whether or not it is in the list).

The trust of TLS addresses is here too: a private CA's file (``tls_ca``, ``$PERSEUS_TLS_CA``;
:func:`read_tls_ca`, :func:`tls_context` for REST calls), and :func:`credential_in_clear`, true
when a token would travel without TLS to an address other than loopback.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perseus_client.errors import ConfigError

__all__ = [
    "TLS_CA_ENV",
    "Endpoint",
    "Resolver",
    "Route",
    "ServerAddress",
    "check_target",
    "credential_in_clear",
    "is_loopback_target",
    "parse_servers",
    "parse_target",
    "read_ca_file",
    "read_tls_ca",
    "system_resolver",
    "tls_context",
]

#: The environment variable naming a PEM file of the CA that signed the server's certificate.
TLS_CA_ENV = "PERSEUS_TLS_CA"

#: ``resolver(host, port)`` -> the IP addresses ``host`` stands for, in the order to try them.
Resolver = Callable[[str, int], Sequence[str]]

_RESOLVER_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")


def parse_target(server: str) -> tuple[str, bool]:
    """Split one address into its gRPC target and whether it says TLS.

    ``host:port``, ``grpc://host:port`` or ``grpcs://host:port`` (also ``http://`` and
    ``https://``) -> ``(target, tls)``.
    """
    s = server.strip()
    for prefix, tls in (
        ("grpcs://", True),
        ("grpc://", False),
        ("https://", True),
        ("http://", False),
    ):
        if s.startswith(prefix):
            return s[len(prefix) :].rstrip("/"), tls
    return s, False


def _target_problem(target: str) -> str | None:
    """Why ``target`` is not ``host:port`` or a resolver target (``None`` when it is)."""
    t = target.strip()
    if t.startswith(_RESOLVER_SCHEMES):
        return None
    host, sep, port = t.rpartition(":")
    if sep != ":" or not host:
        return "no port (expected host:port)"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"the port {port!r} is not a number from 1 to 65535"
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if not host or any(c.isspace() or c in "/?#@[]" for c in host):
        return f"the host {host!r} is not a host name or IP address"
    if ":" in host and not bracketed:
        return "an IPv6 address needs brackets ([v6 address]:port)"
    return None


def check_target(target: str) -> None:
    """Check one gRPC target.

    Raises :class:`ConfigError` (field ``server``) unless ``target`` is ``host:port`` (a port
    1..65535; ``[v6]:port`` for IPv6) or names a gRPC resolver (``unix:path``, ``dns:///...``).
    """
    problem = _target_problem(target)
    if problem is not None:
        raise ConfigError(
            "server",
            f"expected host:port (grpcs://host:port for TLS, [v6 address]:port), got "
            f"{target!r}: {problem}",
        )


@dataclass(frozen=True)
class ServerAddress:
    """One address a rank was given.

    Attributes:
        target: the gRPC target (``host:port``, ``[v6]:port`` or a resolver target).
        tls: whether the rank speaks TLS to it.
    """

    target: str
    tls: bool

    @property
    def host_port(self) -> tuple[str, int] | None:
        """``(host, port)`` of a ``host:port`` target whose host is a name to resolve.

        ``None`` for an IP address, ``localhost`` or a resolver target (nothing to expand).
        """
        if self.target.startswith(_RESOLVER_SCHEMES) or self.target.startswith("["):
            return None
        host, _, port = self.target.rpartition(":")
        try:
            ipaddress.ip_address(host)
            return None
        except ValueError:
            pass
        if host.lower() == "localhost":
            return None
        return host, int(port)

    def __str__(self) -> str:
        """The address as a URL (``grpc://`` or ``grpcs://``)."""
        return f"{'grpcs' if self.tls else 'grpc'}://{self.target}"


@dataclass(frozen=True)
class Endpoint:
    """One address to dial.

    Attributes:
        target: what the channel connects to (``host:port`` or a resolved ``ip:port``).
        tls: whether it speaks TLS.
        authority: the name the server's certificate and the HTTP/2 authority carry when
            ``target`` is one of a name's resolved addresses (``host:port``), else ``None``.
    """

    target: str
    tls: bool
    authority: str | None = None

    def names(self) -> frozenset[str]:
        """The ``host:port`` strings this endpoint answers to (its target and its authority)."""
        return frozenset(x for x in (self.target, self.authority) if x)

    def __str__(self) -> str:
        """The endpoint as a URL, with the name it stands for."""
        shown = self.target if self.authority is None else f"{self.authority} ({self.target})"
        return f"{'grpcs' if self.tls else 'grpc'}://{shown}"


def _split(server: str | Sequence[str]) -> list[str]:
    if isinstance(server, str):
        return server.split(",")
    items = list(server)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ConfigError("server", f"address {i + 1} is not a string: {item!r}")
    return items


def parse_servers(
    server: str | Sequence[str], *, tls_default: bool = False
) -> tuple[ServerAddress, ...]:
    """Check and parse the addresses a rank was given.

    Args:
        server: one address, a comma-separated string of them, or a list.
        tls_default: whether an address without a scheme speaks TLS (a CA was configured);
            ``grpc://`` says plain gRPC, ``grpcs://`` TLS, whatever this says.

    Returns:
        The addresses in the order given, each once.

    Raises:
        ConfigError: field ``server``, naming the address at fault (its position and text) and
            what is wrong with it; also when no address is given.
    """
    raw = _split(server)
    if not raw or all(not r.strip() for r in raw):
        raise ConfigError("server", "no server address given (expected host:port[,host:port])")
    out: list[ServerAddress] = []
    for i, text in enumerate(raw):
        where = f"address {i + 1} of {len(raw)}" if len(raw) > 1 else "the address"
        if not text.strip():
            raise ConfigError("server", f"{where} is empty (a stray comma?) in {server!r}")
        target, tls = parse_target(text)
        problem = _target_problem(target)
        if problem is not None:
            raise ConfigError(
                "server",
                f"{where}, {text.strip()!r}: {problem} "
                "(expected host:port, grpcs://host:port for TLS, or [v6 address]:port)",
            )
        explicit = text.strip().startswith(("grpc://", "grpcs://", "http://", "https://"))
        address = ServerAddress(target, tls if explicit else tls_default)
        if address not in out:
            out.append(address)
    return tuple(out)


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (``getaddrinfo``), each once, in the order given."""
    seen: list[str] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = str(sockaddr[0])
        if family == socket.AF_INET6:
            ip = f"[{ip}]"
        if ip not in seen:
            seen.append(ip)
    return seen


def expand(address: ServerAddress, resolver: Resolver | None) -> list[Endpoint]:
    """The endpoints of one address: one per resolved address of a name that has several."""
    hp = address.host_port
    if hp is None or resolver is None:
        return [Endpoint(address.target, address.tls)]
    host, port = hp
    try:
        ips = list(resolver(host, port))
    except (OSError, UnicodeError):
        ips = []  # gRPC resolves it when it connects (and says why it cannot)
    if len(ips) <= 1:
        return [Endpoint(address.target, address.tls)]
    return [Endpoint(f"{ip}:{port}", address.tls, authority=address.target) for ip in ips]


def read_tls_ca(path: str | os.PathLike[str] | None = None) -> bytes | None:
    """The PEM bytes of the CA file ``path`` (default ``$PERSEUS_TLS_CA``).

    Returns ``None`` when neither is set. Raises :class:`ConfigError` naming the option when the
    file cannot be read or holds no PEM certificate.
    """
    if path is None or not os.fspath(path):
        env = os.environ.get(TLS_CA_ENV) or None
        return None if env is None else read_ca_file(env, TLS_CA_ENV)
    return read_ca_file(path, "tls_ca")


def read_ca_file(path: str | os.PathLike[str], field: str) -> bytes:
    """The PEM bytes of the CA file ``path``.

    Raises :class:`ConfigError` naming ``field`` (the option or variable that gave it) when it
    cannot be read or holds no PEM certificate.
    """
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as exc:
        raise ConfigError(
            field, f"cannot read the CA file {path!s}: {exc.strerror or exc}"
        ) from exc
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError(field, f"{path!s} holds no PEM certificate (BEGIN CERTIFICATE)")
    return pem


def tls_context(tls_ca: str | os.PathLike[str] | None = None) -> ssl.SSLContext | None:
    """An SSL context for REST calls that trusts the CA file ``tls_ca``.

    The default is ``$PERSEUS_TLS_CA``. Use it as ``httpx.Client(verify=ctx)`` or
    ``urllib.request.urlopen(req, context=ctx)``; ``None`` when no CA is configured (use the
    system's roots). Raises :class:`ConfigError` like :func:`read_tls_ca`.
    """
    pem = read_tls_ca(tls_ca)
    if pem is None:
        return None
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
    return ctx


def is_loopback_target(target: str) -> bool:
    """True when the gRPC ``target`` (``host:port``, ``[v6]:port``, ``unix:path``...) is local.

    Loopback means ``localhost`` (or a ``.localhost`` name), a loopback IP (127.0.0.0/8, ::1) or
    a Unix socket; any other name is not resolved and counts as remote.
    """
    t = target.strip()
    if t.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if t.startswith(scheme):
            t = t[len(scheme) :]
            break
    if t.startswith("["):
        host = t[1 : t.find("]")] if "]" in t else t[1:]
    elif t.count(":") == 1:
        host = t.rsplit(":", 1)[0]
    else:
        host = t  # no port, or a bare IPv6 address
    host = host.strip().rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def credential_in_clear(target: str, *, tls: bool, token: str | None) -> bool:
    """True when a token would travel without TLS to a non-loopback ``target``."""
    return bool(token) and not tls and not is_loopback_target(target)


class Route:
    """The endpoint a rank uses now, and the next one to try (see the module docstring).

    Not thread-safe: the plan watcher alone moves it.
    """

    def __init__(
        self, addresses: Sequence[ServerAddress], resolver: Resolver | None = system_resolver
    ) -> None:
        """Start at the first address; ``resolver`` expands names (``None``: never)."""
        if not addresses:
            raise ValueError("a route needs at least one address")
        self.addresses = tuple(addresses)
        self.resolver = resolver
        self._round: list[Endpoint] = self._resolve()
        self._at = 0
        self._detour: Endpoint | None = None

    def _resolve(self) -> list[Endpoint]:
        out: list[Endpoint] = []
        for a in self.addresses:
            for e in expand(a, self.resolver):
                if e not in out:
                    out.append(e)
        return out

    @property
    def current(self) -> Endpoint:
        """The endpoint to use now."""
        return self._detour if self._detour is not None else self._round[self._at]

    @property
    def size(self) -> int:
        """How many endpoints one round tries (after the last resolution)."""
        return len(self._round)

    def advance(self, leader: str | None = None) -> Endpoint:
        """Move on from the current endpoint; returns the next one.

        ``leader``: the ``host:port`` a standby named as the leader's. An endpoint that answers
        to it is next; one that is not in the list is tried next, once, with the current
        endpoint's TLS. Past the end of the list the names are resolved again.
        """
        came_from = self.current
        self._detour = None
        if leader:
            for i, e in enumerate(self._round):
                if leader in e.names():
                    if e == came_from:
                        break  # a standby naming itself: move on
                    self._at = i
                    return self.current
            else:
                self._detour = Endpoint(leader, came_from.tls)
                return self._detour
        self._at += 1
        if self._at >= len(self._round):
            self._round = self._resolve()
            self._at = 0
        return self.current
