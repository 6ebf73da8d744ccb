"""The gRPC PlanService (``perseus.v1``) over :class:`~perseus_server.service.PerseusService`.

The servicer is built from the methods' declarations (:data:`perseus_server.grpc.methods.METHODS`):
each one's body answers the method of its name. Requests are decoded into the service's plain
values and its answers encoded back by the shared codec (:mod:`perseus_common.wire.codec`; a
plan once per plan object, :mod:`perseus_server.grpc.plan_encoder`); the service itself
never sees a protobuf message.

Errors map to status codes: bad fields -> INVALID_ARGUMENT, unknown job -> NOT_FOUND, state
conflicts (rank not registered, identity clash) -> FAILED_PRECONDITION, missing or wrong bearer
token -> UNAUTHENTICATED, a credential over its stream limit -> RESOURCE_EXHAUSTED. The detail
starts with the field at fault (``"global_rank: ..."``).

A rank holds one ``WatchPlan`` stream: a newer stream for the same rank ends the older one with
``ABORTED`` (``"rank_id: replaced by a newer WatchPlan stream for this rank"``); see
:mod:`perseus_server.runtime.hub` for the limit per credential.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server.domain.errors import (
    ApiError,
    BadRequest,
    Conflict,
    NotFound,
    Unauthorized,
    Unavailable,
)
from perseus_server.grpc.gate import TooLargeMessage, token_matches
from perseus_server.grpc.methods import METHODS, REPLACED_DETAIL, Body, Context, Method
from perseus_server.grpc.plan_encoder import PlanEncoder
from perseus_server.runtime.hub import StreamLimitExceeded
from perseus_server.service import PerseusService
from perseus_server.service.credentials import Credentials

__all__ = ["REPLACED_DETAIL", "PlanServicer", "add_to_server", "serialized", "status_code"]

#: A refused report larger than this (bytes) has a garbage collection run (see
#: :meth:`PlanServicer.refused_report`); at most one per ``COLLECT_INTERVAL`` seconds ...
LARGE_REFUSED_BYTES = 1 << 20
COLLECT_INTERVAL = 0.25
#: ... or sooner, once the refused reports not yet collected add up to this many bytes (so what
#: they hold is bounded by bytes, however fast they come; a collection per 16 MiB received).
COLLECT_REFUSED_BYTES = 16 << 20


def status_code(err: ApiError) -> grpc.StatusCode:
    """The status code a call that fails with ``err`` ends with."""
    if isinstance(err, Unavailable):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(err, StreamLimitExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(err, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(err, Conflict):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(err, Unauthorized):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(err, BadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INVALID_ARGUMENT


#: The generated base class, typed as ``Any``: its stub declares each method abstract, and here
#: they are set from the declarations after the class is built (which a type checker cannot see).
_GeneratedServicer: Any = pb_grpc.PlanServiceServicer


class PlanServicer(_GeneratedServicer):
    """RegisterRank, WatchPlan, ReportIterations and FinishRank, built from their declarations.

    One attribute per declared method (:data:`~perseus_server.grpc.methods.METHODS`) runs its
    body, given this servicer (:class:`~perseus_server.grpc.methods.Servicer`).
    """

    def __init__(self, service: PerseusService, token: str | Credentials | None) -> None:
        self.service = service
        self.token = token
        self.encode_plan = PlanEncoder()
        self._collected = -math.inf
        self._refused_bytes = 0

    async def abort(self, context: Context, method: str, err: ApiError) -> NoReturn:
        """End the call with ``err``'s status code (:func:`status_code`), counted."""
        code = status_code(err)
        self.service.metrics.grpc_calls.inc(method=method, code=code.name)
        detail = f"{err.field}: {err.detail}" if err.field else err.detail
        await context.abort(code, detail)
        raise AssertionError("unreachable")

    def ok(self, method: str) -> None:
        """Count a call of ``method`` that ended well."""
        self.service.metrics.grpc_calls.inc(method=method, code="OK")

    async def admit(self, context: Context, method: str, request: Any) -> None:
        """Check the credential again, then the request's size.

        The interceptor checks the credential and its scope first, before any body is read; a
        message over the method's limit arrives as a
        :class:`~perseus_server.grpc.gate.TooLargeMessage`.
        """
        if self.token is not None and not token_matches(context.invocation_metadata(), self.token):
            await self.abort(
                context,
                method,
                Unauthorized("missing or wrong bearer token", field="authorization"),
            )
        if isinstance(request, TooLargeMessage):
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            self.service.metrics.grpc_calls.inc(method=method, code=code.name)
            await context.abort(
                code, f"request: {request.size} bytes exceed this method's {request.limit}"
            )

    def credential(self, context: Context) -> str:
        """Who opens a stream, for the per-credential limit.

        A tenant's credentials count as one: its own and its jobs' rank credentials (one per
        job), so the limit is per tenant, never multiplied by its jobs; another issued
        credential's id; the admin token, the shared token and an open server each count as
        one.
        """
        if isinstance(self.token, Credentials):
            who = self.token.from_metadata(context.invocation_metadata())
            tenant = who.tenant if who is not None else None
            if who is not None and tenant is None and who.job_id is not None:
                tenant = self.service.tenant_of(who.job_id)
            if tenant is not None:
                return f"tenant:{tenant}"
            if who is not None and who.credential_id:
                return f"credential:{who.credential_id}"
            return "admin"
        return "token" if self.token else "open"

    def refused_report(self, size: int) -> None:
        """Free what earlier refused large reports left behind.

        An aborted stream leaves its last message in reference cycles inside the gRPC runtime
        until a full garbage collection (twenty refused reports of 100,000 transfers held
        150 MiB, sixty 400 MiB). A refused report over :data:`LARGE_REFUSED_BYTES` is counted,
        and a collection runs at most once per :data:`COLLECT_INTERVAL` seconds (a full
        collection takes tens of milliseconds) or per :data:`COLLECT_REFUSED_BYTES` refused,
        so refusals hold a bounded number of bytes however fast they come (with the interval
        alone, fast refusals of 4 MB reports held 86-103 MiB over forty).
        """
        if size <= LARGE_REFUSED_BYTES:
            return
        now = time.monotonic()
        self._refused_bytes += size
        if (
            now - self._collected >= COLLECT_INTERVAL
            or self._refused_bytes >= COLLECT_REFUSED_BYTES
        ):
            self._collected, self._refused_bytes = now, 0
            gc.collect()


def _answer(method: Method) -> Any:
    """The servicer attribute that answers ``method``: its body, given the servicer."""
    body: Body = method.body

    async def answer(self: PlanServicer, request: Any, context: Context) -> Any:
        return await body(self, request, context)

    answer.__name__ = answer.__qualname__ = method.name
    answer.__doc__ = body.__doc__
    return answer


for _method in METHODS:
    setattr(PlanServicer, _method.name, _answer(_method))

_SERVICE = pb.DESCRIPTOR.services_by_name["PlanService"]
#: The handler of a method by its shape: (client streaming, server streaming).
_HANDLERS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def serialized(message: Any) -> bytes:
    """A response's bytes on the wire: ``message`` itself when it is serialized already."""
    return message if isinstance(message, bytes) else bytes(message.SerializeToString())


def add_to_server(servicer: PlanServicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer``'s methods on ``server``, as the generated code would.

    Except that a response may be bytes serialized already: ``WatchPlan`` writes each plan's
    message serialized once per plan (:class:`~perseus_server.grpc.plan_encoder.PlanEncoder`), not
    once per stream.
    """
    handlers = {
        m.name: _HANDLERS[m.client_streaming, m.server_streaming](
            getattr(servicer, m.name),
            request_deserializer=getattr(pb, m.input_type.name).FromString,
            response_serializer=serialized,
        )
        for m in _SERVICE.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),)
    )
    server.add_registered_method_handlers(_SERVICE.full_name, handlers)
