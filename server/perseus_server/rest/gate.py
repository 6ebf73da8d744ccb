"""Pure ASGI middleware in front of the REST app.

Unambiguous framing, the host and origin of an open server's requests, credentials and their scope,
body-size cap, request metrics, and the catch-all that turns an unexpected exception into a logged
500 problem body.

Framing: a request with both ``Content-Length`` and ``Transfer-Encoding``, several of either, or
a coding other than ``chunked`` is refused (400) and its connection closed, so no bytes behind
it are read as another request. The body limit counts the bytes that actually arrive, whatever
the framing; over it, 413 and the connection closed.

An open server (no token) answers only requests whose ``Host`` is a loopback name or one it was
configured to allow, and refuses state-changing requests from a foreign ``Origin`` (403): see
:mod:`perseus_server.rest.origins`.

Who may call what is the authorization table of :mod:`perseus_server.service.authorization`
(credential kind x route x own / other tenant), whose REST rows each route declares at its
function (``@allow(rule)``; :func:`route_rules` reads them from the routers): a route the
credential's kind may not use answers 403 naming the scope it needs; a path or method no route
declares opens to the admin only. A route declared :data:`~perseus_server.service.authorization.PUBLIC`
(``/healthz``) needs no credential.

No existence oracle: for a credential whose cell is ``own`` (a tenant's, a rank's), the gate
resolves the path's job id (or tenant id) to *visible* (the caller's own) or *not visible*
(another tenant's, or no such job) first, and answers a job it may not see itself, with the
404 of an unknown id, before the body is sized or read and before any route runs: the same
status, body, headers, metrics (``perseus_refusals_total{reason="not_found"}`` for both) and
the same code path (a dict look-up), whatever the body (oversized, stalled) or the query. The
Gate decides before the body is read, and leaves the caller's :class:`Principal` in the request
state: a route reads it with the :func:`caller` dependency (a listing filters by it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from fastapi import Depends, Request
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perseus_server.config import Limits
from perseus_server.domain.errors import ApiError, NotFound, TooLarge, Unauthorized
from perseus_server.metric_series import OTHER
from perseus_server.metrics import Metrics
from perseus_server.rest.origins import Origins
from perseus_server.rest.problems import problem_response
from perseus_server.runtime.write_limits import WRITE_METHODS, WriteLimits
from perseus_server.service import authorization as authz
from perseus_server.service.credentials import ADMIN, Credentials, Forbidden, Principal
from perseus_server.service.credentials import Scope as CredentialScope
from perseus_server.service.tenants import unknown_tenant

__all__ = [
    "CALLER",
    "Gate",
    "caller",
    "internal_error",
    "public_paths",
    "route_rules",
    "unknown_job",
]

_STATE_KEY = "perseus_principal"


def caller(request: Request) -> Principal:
    """FastAPI dependency: who sent the request (the admin principal on an open server)."""
    found = request.scope.get("state", {}).get(_STATE_KEY)
    return found if isinstance(found, Principal) else ADMIN


#: The :func:`caller` dependency, as a route parameter's default (``who: Principal = CALLER``).
CALLER = Depends(caller)


def route_rules(routes: Iterable[object]) -> Mapping[str, authz.Rule]:
    """The REST rows of the authorization table: each route's declared rule, in route order.

    Keyed ``"METHOD /template"``. A route without a rule (``@allow``), or two routes of one
    key, is a :class:`ValueError` (see :func:`~perseus_server.service.authorization.table`).
    """
    return authz.table(
        (f"{method} {route.path}", authz.rule_of(route.endpoint))
        for route in routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods or ())
    )


def public_paths(rules: Mapping[str, authz.Rule]) -> frozenset[str]:
    """The paths of the routes ``rules`` declares public: they need no credential."""
    return frozenset(key.split(" ", 1)[1] for key, rule in rules.items() if rule is authz.PUBLIC)


def _forbidden(
    who: Principal, needed: CredentialScope, method: str, path: str, tenant_too: bool = False
) -> Forbidden:
    also = " (or a credential of the job's tenant)" if tenant_too else ""
    return Forbidden(
        f"a {who.scope} credential may not {method} {path}: it needs the {needed} scope{also}",
        field="Authorization",
        scope=needed.value,
    )


def unknown_job(job_id: str) -> NotFound:
    """The answer to an unknown job, and to another tenant's (the same body)."""
    return NotFound(f"no job with id {job_id!r}", field="job_id")


def internal_error() -> ApiError:
    """The problem body of an unexpected server error (the details go to the log only)."""
    err = ApiError("an unexpected error occurred; it has been logged")
    err.status, err.title = 500, "Internal server error"
    return err


class Gate:
    """Pure ASGI middleware: credentials and scopes, body-size cap, request metrics.

    ``credentials``: the :class:`Credentials` (``token``: just an admin token; neither: open);
    ``rules``: the routes' rules (:func:`route_rules`; a request no rule covers: the admin's);
    ``owner(job_id)``: the tenant of a stored job (None: no such job).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: Limits,
        metrics: Metrics,
        credentials: Credentials | None = None,
        token: str | None = None,
        rules: Mapping[str, authz.Rule] = MappingProxyType({}),
        allowed_hosts: Iterable[str] = (),
        owner: Callable[[str], str | None] = lambda job_id: None,
        writes: WriteLimits | None = None,
    ) -> None:
        self.app, self.limits, self.metrics = app, limits, metrics
        self.writes = writes  # each tenant's writes, paced (runtime/write_limits.py)
        self.owner = owner
        self.credentials = credentials or Credentials(None, admin=token)
        self.origins = Origins(allowed_hosts)
        self._templates: list[tuple[re.Pattern[str], str]] | None = None
        self.rules = rules
        self.public = public_paths(rules)
        self._forbidden = {key: _needed(rule) for key, rule in rules.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check a request's framing, host, credential and size, then pass it on.

        A refused request is answered with a problem body; an unexpected exception with a
        logged 500.
        """
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
        """The route label: the template of the app's route the request matches, else ``other``.

        The template is of the path; also when the request was refused before routing. Never
        the path the caller sent, so the label's values are bounded by the app's routes.
        """
        found = getattr(scope.get("route"), "path", None)
        if found is not None:
            return str(found)
        return self._match(scope)[0]

    def _match(self, scope: Scope) -> tuple[str, dict[str, str]]:
        """The path template the request's path matches (else ``other``) and its parameters."""
        if self._templates is None:
            openapi = getattr(scope.get("app"), "openapi", None)
            paths = list(openapi().get("paths", {})) if callable(openapi) else []
            paths.sort(key=lambda p: (p.count("{"), p))  # literal segments first
            self._templates = [(_template_re(p), p) for p in paths]
        path = str(scope.get("path", ""))
        for pattern, template in self._templates:
            m = pattern.fullmatch(path)
            if m:
                return template, m.groupdict()
        return OTHER, {}

    def _authorize(self, who: Principal, scope: Scope) -> ApiError | None:
        """Why the table refuses ``who`` this request (None: it may go on)."""
        method = str(scope.get("method", ""))
        template, params = self._match(scope)
        key = f"{'GET' if method == 'HEAD' else method} {template}"
        rule = self.rules.get(key)
        got = authz.access(who, rule)
        if got is authz.Access.NONE:
            self._refused(who, "forbidden")
            needed, tenant_too = self._forbidden.get(key, (CredentialScope.ADMIN, False))
            return _forbidden(who, needed, method, str(scope["path"]), tenant_too)
        if got is authz.Access.OWN:
            job_id, tenant_id = params.get("job_id"), params.get("tenant_id")
            if job_id is not None and not self._visible(who, job_id):
                self._refused(who, "not_found")
                return unknown_job(job_id)
            if tenant_id is not None and who.tenant != tenant_id:
                self._refused(who, "not_found")
                return unknown_tenant(tenant_id)
        return None

    def _paced(self, who: Principal, scope: Scope) -> ApiError | None:
        """A tenant's write over its rate: 429 (before its job is looked at)."""
        if self.writes is None or who.tenant is None or scope.get("method") not in WRITE_METHODS:
            return None
        wait = self.writes.take(who.tenant)
        if wait is None:
            return None
        self._refused(who, "rate_limited")
        return self.writes.refusal(who.tenant, wait)

    def _visible(self, who: Principal, job_id: str) -> bool:
        """Whether ``job_id`` is a job ``who`` may see: its own, never an unknown id.

        Another tenant's job and an id no job has are one answer (not visible), given here,
        before the body is read or sized and before the route runs: nothing a caller can
        observe (status, body, headers, timing, its metrics) tells them apart.
        """
        if who.scope is CredentialScope.RANK:
            return who.job_id == job_id
        owner = self.owner(job_id)
        return owner is not None and owner == who.tenant

    def _refused(self, who: Principal, reason: str) -> None:
        if who.tenant is not None:
            self.metrics.refusals.inc(tenant=who.tenant, reason=reason)

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
        if self.credentials.enabled and scope["path"] not in self.public:
            who = self.credentials.from_header(headers.get("authorization", ""))
            if who is None:
                refused = Unauthorized("missing or wrong bearer token", field="Authorization")
                headers_401 = {"WWW-Authenticate": "Bearer"}
                await problem_response(refused, headers_401)(scope, receive, send)
                return
            refused = self._paced(who, scope) or self._authorize(who, scope)
            if refused is not None:
                await problem_response(refused)(scope, receive, send)
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
    """``/jobs/{job_id}`` -> a pattern matching ``/jobs/<one segment>`` (the group ``job_id``)."""
    out, pos = [], 0
    for m in re.finditer(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", template):
        out.append(re.escape(template[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>[^/]+)")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out))


def _needed(rule: authz.Rule) -> tuple[CredentialScope, bool]:
    """The scope a 403 names, and whether a tenant credential opens the route too.

    The scope is ``read`` when a read credential opens the route, else ``admin``.
    """
    needed = (
        CredentialScope.READ
        if rule[CredentialScope.READ] is not authz.Access.NONE
        else CredentialScope.ADMIN
    )
    return needed, rule[CredentialScope.TENANT] is not authz.Access.NONE


#: Headers of a refusal after which the connection must not carry another request.
_CLOSE = {"Connection": "close"}


def _bad_framing(detail: str, field: str) -> ApiError:
    err = ApiError(detail, field=field)
    err.status, err.title = 400, "Bad request framing"
    return err


def _framing_problem(raw: list[tuple[bytes, bytes]]) -> ApiError | None:
    """Why a request's framing is ambiguous (None: it is not).

    A request with both ``Content-Length`` and ``Transfer-Encoding`` is framed differently by
    different parsers (a proxy in front may read the length, this server the chunks: request
    smuggling), as is one with several of either or a coding other than ``chunked``.
    """
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
