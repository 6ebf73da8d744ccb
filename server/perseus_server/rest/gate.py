"""Pure ASGI middleware in front of the REST app: bearer token, body-size cap, request metrics,
and the catch-all that turns an unexpected exception into a logged 500 problem body."""

from __future__ import annotations

import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perseus_server.config import Limits
from perseus_server.errors import ApiError, TooLarge, Unauthorized
from perseus_server.metrics import Metrics
from perseus_server.rest.problems import problem_response

__all__ = ["Gate", "internal_error"]


def internal_error() -> ApiError:
    """The problem body of an unexpected server error (the details go to the log only)."""
    err = ApiError("an unexpected error occurred; it has been logged")
    err.status, err.title = 500, "Internal server error"
    return err


class Gate:
    """Pure ASGI middleware: bearer-token check, body-size cap, request metrics."""

    def __init__(
        self, app: ASGIApp, *, token: str | None, limits: Limits, metrics: Metrics
    ) -> None:
        self.app, self.token, self.limits, self.metrics = app, token, limits, metrics

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
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.request_latency.observe(
                time.perf_counter() - t0, route=path, method=method
            )
            self.metrics.requests.inc(route=path, method=method, status=str(status[0]))

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        if self.token is not None and scope["path"] != "/healthz":
            auth = headers.get("authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(
                given.strip().encode(), self.token.encode()
            ):
                err = Unauthorized("missing or wrong bearer token", field="Authorization")
                await problem_response(err, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
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
