"""Pure ASGI middleware in front of the REST app: credentials and their scope, body-size cap,
request metrics, and the catch-all that turns an unexpected exception into a logged 500 problem
body.

Scopes on REST (see :mod:`perseus_server.service.credentials`): the admin token opens every route; a
read credential opens ``GET`` and ``HEAD`` (:data:`READ_METHODS`) and gets 403 on every other
method; a rank credential opens no REST route (its business is gRPC). ``/healthz`` needs nothing.
The Gate decides before the body is read, and leaves the caller's :class:`Principal` in the
request state: a route reads it with the :func:`caller` dependency, or demands a scope with
``dependencies=[Depends(requires(Scope.ADMIN))]`` (e.g. a ``GET`` that would reveal a secret).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perseus_server.config import Limits
from perseus_server.domain.errors import ApiError, TooLarge, Unauthorized
from perseus_server.metrics import OTHER, Metrics
from perseus_server.rest.problems import problem_response
from perseus_server.service.credentials import ADMIN, Credentials, Forbidden, Principal
from perseus_server.service.credentials import Scope as CredentialScope

__all__ = ["Gate", "READ_METHODS", "PUBLIC_PATHS", "caller", "internal_error", "requires"]

#: The HTTP methods a read credential may use.
READ_METHODS = frozenset({"GET", "HEAD"})
#: Paths that need no credential.
PUBLIC_PATHS = frozenset({"/healthz"})
_STATE_KEY = "perseus_principal"


def caller(request: Request) -> Principal:
    """FastAPI dependency: who sent the request (the admin principal on an open server)."""
    found = request.scope.get("state", {}).get(_STATE_KEY)
    return found if isinstance(found, Principal) else ADMIN


def requires(scope: CredentialScope) -> Callable[[Request], Principal]:
    """FastAPI dependency factory: 403 unless the caller's scope allows ``scope``."""

    def check(request: Request) -> Principal:
        who = caller(request)
        if not who.allows(scope):
            raise _forbidden(who, scope, request.method, request.url.path)
        return who

    return check


def _forbidden(who: Principal, needed: CredentialScope, method: str, path: str) -> Forbidden:
    return Forbidden(
        f"a {who.scope} credential may not {method} {path}: it needs the {needed} scope",
        field="Authorization",
        scope=needed.value,
    )


def internal_error() -> ApiError:
    """The problem body of an unexpected server error (the details go to the log only)."""
    err = ApiError("an unexpected error occurred; it has been logged")
    err.status, err.title = 500, "Internal server error"
    return err


class Gate:
    """Pure ASGI middleware: credentials and scopes, body-size cap, request metrics.

    ``credentials``: the :class:`Credentials` (``token``: just an admin token; neither: open).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: Limits,
        metrics: Metrics,
        credentials: Credentials | None = None,
        token: str | None = None,
    ) -> None:
        self.app, self.limits, self.metrics = app, limits, metrics
        self.credentials = credentials or Credentials(None, admin=token)
        self._routes_restricted = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]
        started = [False]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                started[0] = True
            await send(message)

        try:
            await self._handle(scope, receive, send_wrapper)
        except Exception:
            # Answer a problem body, then let the exception go on to the server, which logs it
            # with its traceback (as Starlette's own error middleware does).
            self.metrics.internal_errors.inc()
            if not started[0]:
                await problem_response(internal_error())(scope, receive, send_wrapper)
            raise
        finally:
            path = self._route(scope)
            method = str(scope.get("method", ""))
            self.metrics.request_latency.observe(
                time.perf_counter() - t0, route=path, method=method
            )
            self.metrics.requests.inc(route=path, method=method, status=str(status[0]))

    def _route(self, scope: Scope) -> str:
        """The route label: the path template of the app's route the request matches (also
        when it was refused before routing), else ``other``; never the path the caller sent."""
        app = scope.get("app")
        routes = getattr(app, "routes", ())
        if not self._routes_restricted:
            self._routes_restricted = True
            known = [str(getattr(r, "path", "")) for r in routes]
            self.metrics.requests.restrict(route=known)
            self.metrics.request_latency.restrict(route=known)
        found = getattr(scope.get("route"), "path", None)
        if found is not None:
            return str(found)
        probe = {**scope, "method": "GET"}  # a path on a route with other methods: that route
        for r in routes:
            match, _ = r.matches(probe)
            if match is not Match.NONE:
                return str(r.path)
        return OTHER

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        if self.credentials.enabled and scope["path"] not in PUBLIC_PATHS:
            who = self.credentials.from_header(headers.get("authorization", ""))
            if who is None:
                refused = Unauthorized("missing or wrong bearer token", field="Authorization")
                headers_401 = {"WWW-Authenticate": "Bearer"}
                await problem_response(refused, headers_401)(scope, receive, send)
                return
            method = str(scope.get("method", ""))
            needed = CredentialScope.READ if method in READ_METHODS else CredentialScope.ADMIN
            if not who.allows(needed):
                await problem_response(_forbidden(who, needed, method, scope["path"]))(
                    scope, receive, send
                )
                return
            scope.setdefault("state", {})[_STATE_KEY] = who
        is_profile = scope.get("method") == "PUT" and scope["path"].endswith("/profile")
        limit = self.limits.max_profile_bytes if is_profile else self.limits.max_body_bytes
        length = headers.get("content-length")
        too_large = TooLarge(
            f"the body exceeds the limit of {limit} bytes", field="body", limit=limit
        )
        if length is not None:
            if not length.isdigit() or int(length) > limit:
                await problem_response(too_large)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if headers.get("transfer-encoding", "").lower() != "chunked":
            await self.app(scope, receive, send)
            return
        # Chunked body: read it here, bounded, then replay it to the app.
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await problem_response(too_large)(scope, receive, send)
                return
            if not msg.get("more_body"):
                break
        replayed = [False]

        async def replay() -> Message:
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
