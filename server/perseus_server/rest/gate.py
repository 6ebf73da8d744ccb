"""Pure ASGI middleware in front of the REST app: unambiguous framing, the host and origin of an
open server's requests, credentials and their scope, body-size cap, request metrics, and the
catch-all that turns an unexpected exception into a logged 500 problem body.

Framing: a request with both ``Content-Length`` and ``Transfer-Encoding``, several of either, or
a coding other than ``chunked`` is refused (400) and its connection closed, so no bytes behind
it are read as another request. The body limit counts the bytes that actually arrive, whatever
the framing; over it, 413 and the connection closed.

An open server (no token) answers only requests whose ``Host`` is a loopback name or one it was
configured to allow, and refuses state-changing requests from a foreign ``Origin`` (403): see
:mod:`perseus_server.rest.origins`.

Scopes on REST (see :mod:`perseus_server.service.credentials`): the admin token opens every route; a
read credential opens ``GET`` and ``HEAD`` (:data:`READ_METHODS`) and gets 403 on every other
method; a rank credential opens no REST route (its business is gRPC). ``/healthz`` needs nothing.
The Gate decides before the body is read, and leaves the caller's :class:`Principal` in the
request state: a route reads it with the :func:`caller` dependency, or demands a scope with
``dependencies=[Depends(requires(Scope.ADMIN))]`` (e.g. a ``GET`` that would reveal a secret).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perseus_server.config import Limits
from perseus_server.domain.errors import ApiError, TooLarge, Unauthorized
from perseus_server.metrics import OTHER, Metrics
from perseus_server.rest.origins import Origins
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
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.app, self.limits, self.metrics = app, limits, metrics
        self.credentials = credentials or Credentials(None, admin=token)
        self.origins = Origins(allowed_hosts)
        self._templates: list[tuple[re.Pattern[str], str]] | None = None

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
        when it was refused before routing), else ``other``; never the path the caller sent,
        so the label's values are bounded by the app's routes."""
        found = getattr(scope.get("route"), "path", None)
        if found is not None:
            return str(found)
        if self._templates is None:
            openapi = getattr(scope.get("app"), "openapi", None)
            paths = list(openapi().get("paths", {})) if callable(openapi) else []
            paths.sort(key=lambda p: (p.count("{"), p))  # literal segments first
            self._templates = [(_template_re(p), p) for p in paths]
        path = str(scope.get("path", ""))
        for pattern, template in self._templates:
            if pattern.fullmatch(path):
                return template
        return OTHER

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("headers", [])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        framing = _framing_problem(raw)
        if framing is not None:  # refused, and the connection closed: nothing rides behind
            await problem_response(framing, _CLOSE)(scope, receive, send)
            return
        if not self.credentials.enabled:
            refused = self.origins.refusal(scope, headers)
            if refused is not None:
                await problem_response(refused)(scope, receive, send)
                return
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
        if length is not None and (not length.isdigit() or int(length) > limit):
            await problem_response(too_large, _CLOSE)(scope, receive, send)
            return
        # Read the body here, counting what actually arrives whatever the framing, then replay
        # it to the app: no more than ``limit`` bytes are ever held.
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await problem_response(too_large, _CLOSE)(scope, receive, send)
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


def _template_re(template: str) -> re.Pattern[str]:
    """``/jobs/{job_id}`` -> a pattern matching ``/jobs/<one segment>``."""
    return re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)))


#: Headers of a refusal after which the connection must not carry another request.
_CLOSE = {"Connection": "close"}


def _bad_framing(detail: str, field: str) -> ApiError:
    err = ApiError(detail, field=field)
    err.status, err.title = 400, "Bad request framing"
    return err


def _framing_problem(raw: list[tuple[bytes, bytes]]) -> ApiError | None:
    """Why a request's framing is ambiguous (None: it is not). A request with both
    ``Content-Length`` and ``Transfer-Encoding`` is framed differently by different parsers
    (a proxy in front may read the length, this server the chunks: request smuggling), as is
    one with several of either or a coding other than ``chunked``."""
    te = [v for k, v in raw if k.lower() == b"transfer-encoding"]
    cl = [v for k, v in raw if k.lower() == b"content-length"]
    if te and cl:
        return _bad_framing(
            "a request may not carry both Content-Length and Transfer-Encoding",
            "Transfer-Encoding",
        )
    if len(te) > 1 or (te and te[0].strip().lower() != b"chunked"):
        return _bad_framing("Transfer-Encoding must be exactly one 'chunked'", "Transfer-Encoding")
    if len(cl) > 1:
        return _bad_framing("a request may carry one Content-Length", "Content-Length")
    return None
