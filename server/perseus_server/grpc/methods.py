"""Every method of the gRPC ``PlanService``, each declared once.

A :class:`Method` is what the server knows of one method: its name in the ``.proto``, who may
call it (an :mod:`~perseus_server.service.authorization` rule), how the gate checks a rank
credential's requests (:class:`RankCheck`), the largest request it takes, and its body. The
servicer (:mod:`perseus_server.grpc.service`) is built from :data:`METHODS`, and the gate's
tables (:mod:`perseus_server.grpc.gate`: rules, size limits, rank checks) are read from them,
so a new method is its ``.proto`` entry, one declaration here and the service part it calls.

A unary method is declared with :func:`unary`: decode the request into the service's plain
value, call the service, encode the answer; an :class:`~perseus_server.domain.errors.ApiError`
becomes its status code (:func:`perseus_server.grpc.service.status_code`). A flat request (scalar
fields only) needs no wire value of its own: decoded with :func:`as_message`, its call reads the
message's fields (typed by the generated stubs) and hands the service plain values. A streaming method
gives its body itself (:func:`watch_plan`, :func:`report_iterations`).

``tests/server/grpc/test_methods.py`` checks that every method of the ``.proto`` is declared and
classified, and that nothing else is.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import grpc

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import (
    decode_finish,
    decode_plan_request,
    decode_registration,
    encode_ack,
    encode_finished,
    encode_registered,
)
from perseus_common.wire.values import FinishedRank, ReportAck
from perseus_server.domain.errors import ApiError, NotFound
from perseus_server.domain.states import StreamEnd
from perseus_server.grpc.received import WireReport
from perseus_server.service import authorization as authz

if TYPE_CHECKING:
    from perseus_server.grpc.plan_encoder import PlanEncoder
    from perseus_server.service import PerseusService

__all__ = [
    "GRPC",
    "METHODS",
    "SERVICE",
    "Method",
    "RankCheck",
    "Servicer",
    "as_message",
    "by_path",
    "unary",
]

_DESCRIPTOR = pb.DESCRIPTOR.services_by_name["PlanService"]
#: The path prefix of the service's methods (``/perseus.v1.PlanService/``).
SERVICE = f"/{_DESCRIPTOR.full_name}/"

Context = grpc.aio.ServicerContext[Any, Any]

#: The detail a stream replaced by a newer one for the same rank ends with (``ABORTED``).
REPLACED_DETAIL = "rank_id: replaced by a newer WatchPlan stream for this rank"


class Servicer(Protocol):
    """What a method's body uses of the servicer.

    The servicer is :class:`~perseus_server.grpc.service.PlanServicer`.
    """

    service: PerseusService
    encode_plan: PlanEncoder

    async def admit(self, context: Context, method: str, request: Any) -> None:
        """Check the credential and the request's size; aborts the call when either fails."""

    async def abort(self, context: Context, method: str, err: ApiError) -> NoReturn:
        """End the call with ``err``'s status code, counted."""

    def ok(self, method: str) -> None:
        """Count a call that ended well."""

    def credential(self, context: Context) -> str:
        """Who opens a stream, for the per-credential stream limit."""

    def refused_report(self, size: int) -> None:
        """Free what a refused large report left behind (bounded, see the servicer)."""


#: A method's body: ``(servicer, request or request iterator, context) -> answer``.
Body = Callable[[Servicer, Any, Context], Awaitable[Any]]


class RankCheck(StrEnum):
    """How the gate checks each request of a rank credential (its own job's ranks only)."""

    #: ``job_id`` and ``global_rank``: a rank of its job, not bound to another credential; the
    #: answer's ``rank_id`` is then bound to the credential.
    REGISTER = "register"
    #: ``job_id`` and ``rank_id``: a rank of its job that this credential registered (each
    #: message of a request stream; a rotated credential's stream ends at its next message).
    RANK = "rank"


@dataclass(frozen=True)
class Method:
    """One method of ``PlanService``, declared once (see the module docstring)."""

    #: The method's name in the ``.proto``.
    name: str
    #: Who may call it: a rule of :mod:`perseus_server.service.authorization`.
    rule: authz.Rule
    #: The method's body.
    body: Body
    #: How the gate checks a rank credential's requests (None: the rule gives ranks nothing).
    rank_check: RankCheck | None = None
    #: The largest request message, in bytes (None: the server's overall cap).
    limit: int | None = None

    @property
    def path(self) -> str:
        """The method's full path, as a call names it (``/perseus.v1.PlanService/<name>``)."""
        return SERVICE + self.name


def as_message(request: Any) -> Any:
    """A flat request's decoder: the message itself, whose fields its method's call reads.

    What a new method whose request only the server reads uses instead of a wire value (see the
    module docstring); the service still gets plain values, never the message.
    """
    return request


def unary(
    name: str,
    decode: Callable[[Any], Any],
    call: Callable[[PerseusService, Any], Any],
    encode: Callable[[Any], Any],
    *,
    rule: authz.Rule,
    rank_check: RankCheck | None = None,
    limit: int | None = None,
) -> Method:
    """A unary method: ``encode(call(service, decode(request)))``, its errors as status codes."""

    async def body(servicer: Servicer, request: Any, context: Context) -> Any:
        await servicer.admit(context, name, request)
        try:
            answer = call(servicer.service, decode(request))
        except ApiError as e:
            await servicer.abort(context, name, e)
        servicer.ok(name)
        return encode(answer)

    return Method(name, rule, body, rank_check, limit)


async def watch_plan(servicer: Servicer, request: pb.WatchPlanRequest, context: Context) -> None:
    """``WatchPlan``: the rank's current plan, then every new version, until the stream ends.

    Streams through ``context.write`` (grpc.aio allows it). A newer stream for the same rank
    ends this one with ``ABORTED``; a deleted job with ``NOT_FOUND``.
    """
    name = "WatchPlan"
    await servicer.admit(context, name, request)
    req = decode_plan_request(request)
    try:
        sub, first = servicer.service.subscribe(
            req.job_id, req.rank_id, servicer.credential(context)
        )
    except ApiError as e:
        await servicer.abort(context, name, e)
    metrics = servicer.service.metrics
    try:
        last = -1
        if first is not None:
            sub.latest = None  # the current plan goes out now; don't send it twice
            await context.write(servicer.encode_plan(first))
            last = first.version
        while True:
            msg = await sub.next()
            if msg is None:
                if sub.closed is StreamEnd.DELETED:
                    await servicer.abort(
                        context, name, NotFound("the job was deleted", field="job_id")
                    )
                if sub.closed is StreamEnd.REPLACED:
                    metrics.grpc_calls.inc(method=name, code="ABORTED")
                    await context.abort(grpc.StatusCode.ABORTED, REPLACED_DETAIL)
                break
            if msg.version == last:
                continue
            await context.write(servicer.encode_plan(msg))
            last = msg.version
            metrics.push_latency.observe(time.perf_counter() - sub.published_at)
    finally:
        servicer.service.unsubscribe(sub)
    servicer.ok(name)


async def report_iterations(
    servicer: Servicer, requests: AsyncIterator[pb.IterationReport], context: Context
) -> pb.ReportAck:
    """``ReportIterations``: each report of the stream ingested, then one acknowledgement."""
    name = "ReportIterations"
    await servicer.admit(context, name, None)
    accepted = duplicates = 0
    async for report in requests:
        try:
            new, dup = await servicer.service.ingest_report(WireReport.of(report))
            accepted, duplicates = accepted + new + dup, duplicates + dup
        except ApiError as e:
            servicer.refused_report(report.ByteSize())
            await servicer.abort(context, name, e)
    servicer.ok(name)
    return encode_ack(ReportAck(accepted, duplicates))


#: Every method of ``PlanService``, in the ``.proto``'s order.
METHODS: tuple[Method, ...] = (
    unary(
        "RegisterRank",
        decode_registration,
        lambda service, reg: service.register_rank(reg),
        encode_registered,
        rule=authz.RANK_CALL,
        rank_check=RankCheck.REGISTER,
        limit=64 * 1024,
    ),
    Method("WatchPlan", authz.RANK_CALL, watch_plan, RankCheck.RANK, limit=4 * 1024),
    Method("ReportIterations", authz.RANK_CALL, report_iterations, RankCheck.RANK),
    unary(
        "FinishRank",
        decode_finish,
        lambda service, req: FinishedRank(*service.finish_rank(req.job_id, req.rank_id)),
        encode_finished,
        rule=authz.RANK_CALL,
        rank_check=RankCheck.RANK,
        limit=4 * 1024,
    ),
)

#: Method name -> its rule: the gRPC rows of the authorization table (``docs/server.md``).
GRPC: Mapping[str, authz.Rule] = authz.table((m.name, m.rule) for m in METHODS)


def by_path(path: str) -> Method | None:
    """The declared method a call's path names (None: none)."""
    return _BY_PATH.get(path)


_BY_PATH = {m.path: m for m in METHODS}
