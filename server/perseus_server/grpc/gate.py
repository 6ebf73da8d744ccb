"""What the gRPC server checks before it reads a request.

It checks the credential from the call's metadata, and each method's request size; and, for a
rank credential, what the request is about.

:class:`AuthInterceptor` runs when a call's headers arrive. Without a valid credential, it answers
UNAUTHENTICATED through a request-streaming handler that never reads a message, so an
unauthenticated body is neither parsed nor kept (a unary handler would receive it first); a
credential whose kind the method's rule does not open it to gets PERMISSION_DENIED the same way.
Otherwise the method's own handler runs, its deserializer refusing a message over the method's
limit (:data:`METHOD_LIMITS`) before parsing it: a registration is small, a report batch message
is bounded by ``max_report_instructions``. The rules, the limits and the rank checks are the
methods' declarations (:data:`perseus_server.grpc.methods.METHODS`); a method not declared
opens to the admin only.

A rank credential (see :mod:`perseus_server.service.credentials`) opens its own job's rank
methods only: the handler is wrapped, by the method's
:class:`~perseus_server.grpc.methods.RankCheck` and the call's shape, so that each request (each
message of a stream) naming another job, or a rank identity bound to another credential, is
refused with PERMISSION_DENIED before the servicer sees it, and a registration binds the identity.
A stream opened with a credential that is rotated or revoked meanwhile ends with UNAUTHENTICATED
at its next report, or before its next plan message (:meth:`Credentials.current`).
"""

from __future__ import annotations

import functools
import inspect
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from perseus_common.proto import perseus_pb2 as pb
from perseus_server.grpc.methods import METHODS, SERVICE, RankCheck, by_path
from perseus_server.service import authorization as authz
from perseus_server.service.credentials import Credentials, Principal

__all__ = [
    "AuthInterceptor",
    "GRPC_CODES",
    "GRPC_METHODS",
    "METHOD_LIMITS",
    "TooLargeMessage",
    "method_label",
    "token_matches",
]

#: The label of a method the service does not define (as :data:`perseus_server.metrics.OTHER`).
OTHER = "other"
#: The methods of the service descriptor: the only values of the ``method`` metric label
#: (with ``other``).
GRPC_METHODS = frozenset(m.name for m in pb.DESCRIPTOR.services_by_name["PlanService"].methods)
#: The status code names: the only values of the ``code`` metric label.
GRPC_CODES = frozenset(c.name for c in grpc.StatusCode)


def method_label(method: str) -> str:
    """The metric label of a call to ``method`` (``/package.Service/Name``): the method's name
    when the service defines it, else ``other`` (never a name the caller made up)."""
    name = method.rsplit("/", 1)[-1]
    return name if method == SERVICE + name and name in GRPC_METHODS else OTHER


#: Largest request message per method path, in bytes, from the declarations (the server's
#: overall cap applies to the others).
METHOD_LIMITS = {m.path: m.limit for m in METHODS if m.limit is not None}


class TooLargeMessage:
    """What a size-checking deserializer yields in place of an over-long message."""

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit


def token_matches(metadata: Any, token: str | Credentials) -> bool:
    """Whether ``metadata`` carries ``authorization: Bearer <token>`` (constant-time compare);
    given :class:`Credentials`, whether it carries any credential they accept."""
    if isinstance(token, Credentials):
        return token.from_metadata(metadata) is not None
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


async def _deny(context: grpc.aio.ServicerContext[Any, Any], why: str) -> None:
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)


_STALE = "authorization: this credential was rotated or revoked"


async def _stale(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _STALE)


class _CheckedWrites:
    """A servicer context whose ``write`` first checks that the call's credential is current."""

    def __init__(self, context: Any, creds: Credentials, who: Principal, refused: Any) -> None:
        self._context, self._creds, self._who, self._refused = context, creds, who, refused

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: Any) -> None:
        if not self._creds.current(self._who):
            self._refused()
            await _stale(self._context)
        await self._context.write(message)


def _denier(why: str) -> Callable[..., Awaitable[None]]:
    async def deny(request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await _deny(context, why)

    return deny


Refused = Callable[[str, str], None]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Credential and per-method size checks ahead of the servicer (see the module docstring).

    ``credentials``: the :class:`Credentials` (or just the admin token; None: open server).
    ``on_refused(method, code)`` hears of every call refused here (for the metrics).
    """

    def __init__(
        self,
        credentials: Credentials | str | None,
        on_refused: Callable[..., None] | None = None,
    ) -> None:
        if not isinstance(credentials, Credentials):
            credentials = Credentials(None, admin=credentials)
        self.credentials = credentials
        self.on_refused: Refused = on_refused or (lambda method, code="": None)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = handler_call_details.method
        name = method_label(method)
        who = self.credentials.from_metadata(handler_call_details.invocation_metadata)
        if who is None:
            self.on_refused(name, "UNAUTHENTICATED")
            return grpc.stream_unary_rpc_method_handler(_refuse)
        declared = by_path(method)
        got = authz.access(who, declared.rule if declared is not None else None)
        if got is authz.Access.NONE or (
            got is authz.Access.OWN and (declared is None or declared.rank_check is None)
        ):
            self.on_refused(name, "PERMISSION_DENIED")
            return grpc.stream_unary_rpc_method_handler(
                _denier(f"a {who.scope} credential cannot call {name}")
            )
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        limit = METHOD_LIMITS.get(method)
        if limit is not None:
            handler = handler._replace(
                request_deserializer=_sized(handler.request_deserializer, limit)
            )
        if got is authz.Access.OWN and declared is not None and declared.rank_check is not None:
            handler = self._own_ranks(handler, who, name, declared.rank_check)
        return handler

    # --- a rank credential's own job and identities ----------------------------------------------

    def _refused(self, method: str) -> None:
        self.on_refused(method, "PERMISSION_DENIED")

    def _own_ranks(self, handler: Any, who: Principal, name: str, check: RankCheck) -> Any:
        """``handler`` wrapped so that a rank credential reaches its own job's ranks only.

        The wrapper is chosen by the method's :class:`RankCheck` and the call's shape.
        """
        if check is RankCheck.REGISTER and handler.unary_unary is not None:
            return self._register(handler, who, name)
        if check is RankCheck.RANK and handler.unary_unary is not None:
            return self._unary(handler, who, name)
        if check is RankCheck.RANK and handler.unary_stream is not None:
            return self._watch(handler, who, name)
        if check is RankCheck.RANK and handler.stream_unary is not None:
            return self._reports(handler, who, name)
        raise TypeError(f"{name}: no {check} check for this kind of call")

    def _register(self, handler: Any, who: Principal, name: str) -> Any:
        """A registration: a rank of the credential's job, then its identity bound to it."""
        behavior, creds = handler.unary_unary, self.credentials

        async def register(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, TooLargeMessage):
                return await behavior(request, context)
            why = creds.register_refusal(who, request.job_id, request.global_rank)
            if why is not None:
                self._refused(name)
                await _deny(context, why)
            response = await behavior(request, context)
            why = creds.bind(who, response.rank_id, request.job_id, request.global_rank)
            if why is not None:
                self._refused(name)
                await _deny(context, why)
            return response

        return handler._replace(unary_unary=register)

    def _watch(self, handler: Any, who: Principal, name: str) -> Any:
        """A request answered by a stream: the rank checked, then each message while current.

        Every plan message goes out only while the credential is current (not rotated or
        revoked since the call began).
        """
        behavior, creds = handler.unary_stream, self.credentials

        async def check(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            if isinstance(request, TooLargeMessage):
                return
            why = creds.rank_refusal(who, request.job_id, request.rank_id)
            if why is not None:
                self._refused(name)
                await _deny(context, why)

        if inspect.isasyncgenfunction(behavior):

            async def watch_gen(request: Any, context: Any) -> AsyncIterator[Any]:
                await check(request, context)
                async for msg in behavior(request, context):
                    if not creds.current(who):
                        self.on_refused(name, "UNAUTHENTICATED")
                        await _stale(context)
                    yield msg

            return handler._replace(unary_stream=watch_gen)

        async def watch(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(request, context)
            stale = functools.partial(self.on_refused, name, "UNAUTHENTICATED")
            return await behavior(request, _CheckedWrites(context, creds, who, stale))

        return handler._replace(unary_stream=watch)

    def _unary(self, handler: Any, who: Principal, name: str) -> Any:
        """A unary call (``FinishRank``): only its own job's ranks."""
        behavior, creds = handler.unary_unary, self.credentials

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if not isinstance(request, TooLargeMessage):
                why = creds.rank_refusal(who, request.job_id, request.rank_id)
                if why is not None:
                    self._refused(name)
                    await _deny(context, why)
            return await behavior(request, context)

        return handler._replace(unary_unary=unary)

    def _reports(self, handler: Any, who: Principal, name: str) -> Any:
        """A request stream (``ReportIterations``): every message checked as it arrives."""
        behavior, creds = handler.stream_unary, self.credentials

        async def reports(
            request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> Any:
            async def checked() -> AsyncIterator[Any]:
                async for report in request_iterator:
                    if not creds.current(who):
                        self.on_refused(name, "UNAUTHENTICATED")
                        await _stale(context)
                    why = creds.rank_refusal(who, report.job_id, report.rank_id)
                    if why is not None:
                        self._refused(name)
                        await _deny(context, why)
                    yield report

            return await behavior(checked(), context)

        return handler._replace(stream_unary=reports)
