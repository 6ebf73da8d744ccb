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
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = [
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

    def heard(self, leader: LeaderAddress) -> None:
        """The lease says ``leader`` leads (called while this server waits)."""
        self.leader = leader

    def lead(self, epoch: int | None) -> None:
        """This server leads from now on: calls go through to the service.

        Args:
            epoch: its leadership's epoch (``None`` for a server on its own, with SQLite).
        """
        self.epoch = epoch
        self.leading = True

    def describe(self) -> str:
        """One line: who leads and where."""
        leader = self.leader
        if leader is None:
            return "no leader is known yet"
        where = leader.grpc or "an address it did not advertise"
        state = "" if leader.live else ", its lease expired"
        return f"the leader is {leader.holder} at {where} (epoch {leader.epoch}{state})"


class StandbyInterceptor(grpc.aio.ServerInterceptor):
    """Every gRPC call of a standby answered ``UNAVAILABLE``, naming the leader.

    First in the interceptor chain: nothing behind it runs until the server leads.
    """

    def __init__(self, standby: Standby) -> None:
        """Answer for ``standby`` until it leads."""
        self.standby = standby

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        """Pass the call on while leading, else answer it here."""
        if self.standby.leading:
            return await continuation(handler_call_details)
        return grpc.stream_unary_rpc_method_handler(self._answer)

    async def _answer(self, request_iterator: Any, context: Any) -> None:
        leader = self.standby.leader
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"this server is a standby: {self.standby.describe()}",
            trailing_metadata=(
                (LEADER_METADATA, leader.grpc if leader is not None else ""),
                ("perseus-role", "standby"),
            ),
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
    """The REST app behind a gate: the standby's answers until the server leads (ASGI)."""

    def __init__(self, app: Any, standby: Standby) -> None:
        """Put ``app`` behind ``standby``'s answers."""
        self.app = app
        self.standby = standby

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on while leading (``/healthz`` with the role), else answer it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.standby.leading:
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

    async def _answer(self, scope: Scope, send: Send) -> None:
        standby, leader = self.standby, self.standby.leader
        method, path = scope["method"], scope["path"]
        head = method == "HEAD"
        headers = [(b"perseus-role", b"standby")]
        if leader is not None and leader.rest:
            headers.append((b"perseus-leader", leader.rest.encode()))
        if path == "/healthz" and method in ("GET", "HEAD"):
            body = {
                "status": "standby",
                "role": "standby",
                "leader": None if leader is None else leader.doc(),
                "epoch": None if leader is None else leader.epoch,
            }
            await _respond(send, 503, body, headers, head)
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
        body = {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": f"this server is a standby: {standby.describe()}; send it to the leader",
            "leader": None if leader is None else leader.doc(),
        }
        headers.append((b"retry-after", str(RETRY_AFTER).encode()))
        await _respond(send, 503, body, headers, head)
