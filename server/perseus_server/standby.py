"""The standby's answers: what a server that does not lead says on its ports.

With PostgreSQL, ``perseus serve`` listens at once, leader or not (see
:mod:`perseus_server.runtime.leadership`). Until it leads, :class:`Standby` answers for it:

- every gRPC call: ``UNAVAILABLE``, the details naming the leader's gRPC address, and the
  trailing metadata ``perseus-leader: HOST:PORT`` (empty while no leader is known) and
  ``perseus-role: standby``; a rank given several addresses moves to the leader
  (:mod:`perseus_client.transport`);
- REST ``GET`` and ``HEAD``: ``307 Temporary Redirect`` to the same path and query on the
  leader's REST address (``503`` while no leader is known);
- REST writes: ``503`` with ``Retry-After`` and the leader's address in the problem body and
  the ``Perseus-Leader`` header (a redirected write could be sent twice by a client that does
  not know the standby acted on nothing);
- ``GET /healthz``: ``503`` ``{"status": "standby", "role": "standby", "leader": {...},
  "epoch": N}``: not ready, so a Kubernetes Service (readiness on ``/healthz``) sends ranks and
  requests to the leader alone, while the standby stays alive and reachable;
- ``GET /metrics``: the standby's own two gauges, ``perseus_leader 0`` and
  ``perseus_leader_epoch`` (not redirected: a scraper following it would count the leader's
  series twice).

Once it leads (:meth:`Standby.lead`), every call goes through to the service as usual, on the
same ports, without a restart; the leader's ``/healthz`` carries ``Perseus-Role: leader`` and
``Perseus-Epoch`` headers.

**Authentication first.** With a token configured, a standby checks the call's credential before
it says anything of the leader: no valid credential gets ``401`` (``WWW-Authenticate: Bearer``)
on REST and ``UNAUTHENTICATED`` on gRPC, with no leader address, holder or epoch anywhere in the
answer; its ``/healthz`` (public) says ``standby`` and nothing of the leader. A credential it
cannot check (the database cannot be reached) gets ``503`` / ``UNAVAILABLE``, again without the
leader.

**A lapsed leader answers nothing.** A leader serves only while its lease holds by its own
clock (:meth:`perseus_server.runtime.leadership.Leader.holds`: the lease was taken or last
renewed less than its length ago, counted from before the query that did it, so never past the
database's expiry). Past that (a process stopped longer than its lease and resumed, renewals
failing) every call is answered here as by a standby that knows no leader, its role ``lapsed``:
REST ``503`` with ``Retry-After`` (``/healthz`` too), gRPC ``UNAVAILABLE`` with an empty
``perseus-leader``, so ranks try their other addresses; never a stale read or a refused write's
500. It serves again once a renewal succeeds, or stops (exit status 3) when the lease was taken.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from perseus_server.domain.errors import Unauthorized

__all__ = [
    "Authenticates",
    "LEADER_METADATA",
    "LeaderAddress",
    "Standby",
    "StandbyGate",
    "StandbyInterceptor",
    "advertise_problem",
    "advertised",
    "read_advertised",
]

#: The trailing metadata key naming the leader's gRPC address (the client reads it too).
LEADER_METADATA = "perseus-leader"
#: Seconds a standby asks REST writers to wait before trying again.
RETRY_AFTER = 2

log = logging.getLogger("perseus.server")


class Authenticates(Protocol):
    """What the standby's answers use of the server's credentials (``Credentials``)."""

    @property
    def enabled(self) -> bool:
        """Whether calls must authenticate."""

    def from_header(self, authorization: str) -> object | None:
        """Who an ``Authorization`` header value is (None: nobody)."""

    def from_metadata(self, metadata: Iterable[tuple[str, Any]] | None) -> object | None:
        """Who a gRPC call's metadata is (None: nobody)."""


def _authenticated(credentials: Authenticates | None, check: Callable[[], object]) -> bool | None:
    """Whether the call carries a valid credential (None: it cannot be checked now)."""
    if credentials is None or not credentials.enabled:
        return True
    try:
        return check() is not None
    except Exception as e:  # the store of issued credentials cannot be reached
        log.warning("a standby could not check a credential: %s", e)
        return None


@dataclass(frozen=True)
class LeaderAddress:
    """Where the leader says it can be reached (stored with its lease).

    Attributes:
        holder: the lease holder's id (``HOST:PID:...``).
        epoch: the leadership epoch.
        grpc: the leader's gRPC address, ``host:port`` (``""`` when it advertised none).
        rest: the leader's REST base URL, ``http(s)://host:port`` (``""`` when none).
        live: whether its lease still runs (a dead leader's address until the lease expires).
    """

    holder: str
    epoch: int
    grpc: str = ""
    rest: str = ""
    live: bool = True

    def doc(self) -> dict[str, Any]:
        """The JSON form the standby answers with."""
        return {
            "holder": self.holder,
            "grpc": self.grpc,
            "rest": self.rest,
            "lease_live": self.live,
        }


def advertise_problem(host: str) -> str | None:
    """Why ``host`` cannot be an advertised host (``None`` when it can).

    It must be a host name or an IP address, without a port or a scheme (the ports are the ones
    the server listens on).
    """
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if not h:
        return "empty (expected a host name or an IP address)"
    if "://" in h or any(c.isspace() or c in "/?#@[],;" for c in h):
        return "expected a host name or an IP address, without a scheme, path or port"
    if ":" in h:
        try:
            ipaddress.IPv6Address(h)
        except ValueError:
            return "expected a host name or an IP address without a port (the ports are --grpc-port and --http-port)"
    return None


def advertised(grpc_address: str, rest_url: str) -> str:
    """The text stored with the lease: the leader's addresses as JSON."""
    return json.dumps({"grpc": grpc_address, "rest": rest_url}, sort_keys=True)


def read_advertised(text: str) -> tuple[str, str]:
    """``(grpc, rest)`` from what :func:`advertised` stored (``("", "")`` for anything else)."""
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        return "", ""
    if not isinstance(doc, dict):
        return "", ""
    return str(doc.get("grpc") or ""), str(doc.get("rest") or "")


class Standby:
    """Whether this server leads, and who does while it does not."""

    def __init__(self) -> None:
        """Not leading, no leader known yet."""
        self.leading = False
        self.epoch: int | None = None
        self.leader: LeaderAddress | None = None
        self._holds: Callable[[], bool] = lambda: True

    def heard(self, leader: LeaderAddress) -> None:
        """The lease says ``leader`` leads (called while this server waits)."""
        self.leader = leader

    def lead(self, epoch: int | None, holds: Callable[[], bool] | None = None) -> None:
        """This server leads from now on: calls go through to the service while it holds.

        Args:
            epoch: its leadership's epoch (``None`` for a server on its own, with SQLite).
            holds: whether its lease still holds, now (default: always, a server on its own).
        """
        self.epoch = epoch
        self._holds = holds or (lambda: True)
        self.leading = True

    @property
    def serving(self) -> bool:
        """Whether calls go through to the service: it leads, and its lease holds now."""
        return self.leading and self._holds()

    @property
    def role(self) -> str:
        """``leader``, ``lapsed`` (it led, its lease no longer holds) or ``standby``."""
        if not self.leading:
            return "standby"
        return "leader" if self._holds() else "lapsed"

    def known_leader(self) -> LeaderAddress | None:
        """The leader it can name: none while it is itself a lapsed leader."""
        return None if self.leading else self.leader

    def describe(self) -> str:
        """One line: who leads and where."""
        if self.leading:
            return (
                f"this server's leader lease (epoch {self.epoch}) ran out before it was renewed; "
                "it serves nothing until it renews it or stands down"
            )
        leader = self.leader
        if leader is None:
            return "no leader is known yet"
        where = leader.grpc or "an address it did not advertise"
        state = "" if leader.live else ", its lease expired"
        return f"the leader is {leader.holder} at {where} (epoch {leader.epoch}{state})"


class StandbyInterceptor(grpc.aio.ServerInterceptor):
    """Every gRPC call of a standby (or a lapsed leader) answered here.

    ``UNAUTHENTICATED`` without a valid credential, else ``UNAVAILABLE`` naming the leader.
    First in the interceptor chain: nothing behind it runs until the server leads (and while
    its lease holds).
    """

    def __init__(self, standby: Standby, credentials: Authenticates | None = None) -> None:
        """Answer for ``standby`` until it leads; ``credentials``: who may hear of the leader."""
        self.standby = standby
        self.credentials = credentials

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        """Pass the call on while serving, else answer it here."""
        if self.standby.serving:
            return await continuation(handler_call_details)
        creds, metadata = self.credentials, handler_call_details.invocation_metadata
        known = _authenticated(creds, lambda: creds and creds.from_metadata(metadata))
        if known is False:
            return grpc.stream_unary_rpc_method_handler(_unauthenticated)
        if known is None:
            return grpc.stream_unary_rpc_method_handler(_unchecked)
        return grpc.stream_unary_rpc_method_handler(self._answer)

    async def _answer(self, request_iterator: Any, context: Any) -> None:
        standby = self.standby
        leader = standby.known_leader()
        said = (
            standby.describe()
            if standby.leading
            else f"this server is a standby: {standby.describe()}"
        )
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            said,
            trailing_metadata=(
                (LEADER_METADATA, leader.grpc if leader is not None else ""),
                ("perseus-role", standby.role),
            ),
        )


async def _unauthenticated(request_iterator: Any, context: Any) -> None:
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED, "authorization: missing or wrong bearer token"
    )


async def _unchecked(request_iterator: Any, context: Any) -> None:
    await context.abort(
        grpc.StatusCode.UNAVAILABLE, "authorization: the credential cannot be checked now; retry"
    )


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _respond(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]], head: bool
) -> None:
    payload = json.dumps(body).encode()
    content_type = b"application/problem+json" if status >= 400 else b"application/json"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(payload)).encode()),
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else payload})


async def _metrics(send: Send, leader: LeaderAddress | None, head: bool) -> None:
    """A standby's own metrics: that it does not lead, and the epoch it knows.

    Not redirected: a scraper that followed a redirect would count the leader's series twice,
    under the standby's name.
    """
    lines = [
        "# HELP perseus_leader 1 on the leader of an active/standby pair, 0 on a standby.",
        "# TYPE perseus_leader gauge",
        "perseus_leader 0",
    ]
    if leader is not None:
        lines += [
            "# HELP perseus_leader_epoch The leadership epoch this server knows.",
            "# TYPE perseus_leader_epoch gauge",
            f"perseus_leader_epoch {leader.epoch}",
        ]
    payload = ("\n".join(lines) + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/plain; version=0.0.4"),
                (b"content-length", str(len(payload)).encode()),
                (b"perseus-role", b"standby"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else payload})


class StandbyGate:
    """The REST app behind a gate: the standby's answers until the server leads (ASGI).

    And while a leader's lease does not hold (see the module docstring).
    """

    def __init__(
        self, app: Any, standby: Standby, credentials: Authenticates | None = None
    ) -> None:
        """Put ``app`` behind ``standby``'s answers; ``credentials``: who may hear of the leader."""
        self.app = app
        self.standby = standby
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on while serving (``/healthz`` with the role), else answer it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.standby.serving:
            if scope["path"] != "/healthz":
                await self.app(scope, receive, send)
                return
            await self.app(scope, receive, self._with_role(send))
            return
        await self._answer(scope, send)

    def _with_role(self, send: Send) -> Send:
        extra = [(b"perseus-role", b"leader")]
        if self.standby.epoch is not None:
            extra.append((b"perseus-epoch", str(self.standby.epoch).encode()))

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return sending

    def _known(self, scope: Scope) -> bool | None:
        """Whether the request carries a valid credential (None: it cannot be checked now)."""
        creds = self.credentials
        auth = next(
            (
                v.decode("latin-1")
                for k, v in scope.get("headers", [])
                if k.lower() == b"authorization"
            ),
            "",
        )
        return _authenticated(creds, lambda: creds and creds.from_header(auth))

    async def _answer(self, scope: Scope, send: Send) -> None:
        standby = self.standby
        method, path = scope["method"], scope["path"]
        head = method == "HEAD"
        known = self._known(scope)
        # Nothing of the leader to a caller without a valid credential.
        leader = standby.known_leader() if known else None
        headers = [(b"perseus-role", standby.role.encode())]
        if leader is not None and leader.rest:
            headers.append((b"perseus-leader", leader.rest.encode()))
        if path == "/healthz" and method in ("GET", "HEAD"):
            await _health(send, standby, leader, headers, head)
            return
        if not known:
            await _refuse(send, known, headers, head)
            return
        if path == "/metrics" and method in ("GET", "HEAD"):
            await _metrics(send, leader, head)
            return
        if method in ("GET", "HEAD") and leader is not None and leader.rest:
            query = scope.get("query_string", b"")
            target = leader.rest.rstrip("/") + path + (("?" + query.decode()) if query else "")
            headers.append((b"location", target.encode()))
            body = {"status": 307, "title": "standby", "detail": f"see {target}"}
            await _respond(send, 307, body, headers, head)
            return
        said = (
            standby.describe()
            if standby.leading
            else f"this server is a standby: {standby.describe()}"
        )
        body = {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": f"{said}; send it to the leader",
            "leader": None if leader is None else leader.doc(),
        }
        headers.append((b"retry-after", str(RETRY_AFTER).encode()))
        await _respond(send, 503, body, headers, head)


async def _health(
    send: Send,
    standby: Standby,
    leader: LeaderAddress | None,
    headers: list[tuple[bytes, bytes]],
    head: bool,
) -> None:
    """``/healthz`` of a server that does not serve: 503, its role, the leader if it may say."""
    body = {
        "status": standby.role,
        "role": standby.role,
        "leader": None if leader is None else leader.doc(),
        "epoch": None if leader is None else leader.epoch,
    }
    await _respond(send, 503, body, headers, head)


async def _refuse(
    send: Send, known: bool | None, headers: list[tuple[bytes, bytes]], head: bool
) -> None:
    """401 for a missing or wrong credential; 503 for one that cannot be checked now."""
    if known is None:
        body = {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "the credential cannot be checked now; retry",
            "field": "Authorization",
        }
        headers = [*headers, (b"retry-after", str(RETRY_AFTER).encode())]
        await _respond(send, 503, body, headers, head)
        return
    problem = Unauthorized("missing or wrong bearer token", field="Authorization").problem()
    await _respond(send, 401, problem, [*headers, (b"www-authenticate", b"Bearer")], head)
