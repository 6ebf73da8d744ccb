"""What the gRPC server checks before it reads a request: the bearer token from the call's
metadata, and each method's request size.

:class:`AuthInterceptor` runs when a call's headers arrive. Without the token, it answers
UNAUTHENTICATED through a request-streaming handler that never reads a message, so an
unauthenticated body is neither parsed nor kept (a unary handler would receive it first).
With the token, the method's own handler runs, its deserializer refusing a message over the
method's limit (:data:`METHOD_LIMITS`) before parsing it: a registration is small, a report
batch message is bounded by ``max_report_instructions``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = ["AuthInterceptor", "METHOD_LIMITS", "TooLargeMessage", "token_matches"]

_SERVICE = "/perseus.v1.PlanService/"

#: Largest request message per method, in bytes (the server's overall cap applies to others).
METHOD_LIMITS = {
    _SERVICE + "RegisterRank": 64 * 1024,
    _SERVICE + "WatchPlan": 4 * 1024,
}


class TooLargeMessage:
    """What a size-checking deserializer yields in place of an over-long message."""

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit


def token_matches(metadata: Any, token: str) -> bool:
    """Whether ``metadata`` carries ``authorization: Bearer <token>`` (constant-time compare)."""
    for key, value in metadata or ():
        if str(key).lower() == "authorization":
            scheme, _, given = str(value).partition(" ")
            if scheme.lower() == "bearer" and secrets.compare_digest(
                given.strip().encode(), token.encode()
            ):
                return True
    return False


async def _refuse(request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED, "authorization: missing or wrong bearer token"
    )


def _sized(deserialize: Callable[[bytes], Any] | None, limit: int) -> Callable[[bytes], Any]:
    def check(data: bytes) -> Any:
        if len(data) > limit:
            return TooLargeMessage(len(data), limit)
        return deserialize(data) if deserialize is not None else data

    return check


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Token and per-method size checks ahead of the servicer (see the module docstring)."""

    def __init__(self, token: str | None, on_refused: Callable[[str], None] | None = None) -> None:
        self.token = token
        self.on_refused = on_refused or (lambda method: None)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = handler_call_details.method
        if self.token is not None and not token_matches(
            handler_call_details.invocation_metadata, self.token
        ):
            self.on_refused(method.rsplit("/", 1)[-1])
            return grpc.stream_unary_rpc_method_handler(_refuse)
        handler = await continuation(handler_call_details)
        limit = METHOD_LIMITS.get(method)
        if handler is None or limit is None:
            return handler
        return handler._replace(request_deserializer=_sized(handler.request_deserializer, limit))
