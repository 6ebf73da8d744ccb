"""The gRPC PlanService (``perseus.v1``) over :class:`~perseus_server.service.PerseusService`.

Requests are decoded into the service's plain values and its answers encoded back by
:mod:`perseus_server.grpc.codec`; the service itself never sees a protobuf message.

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
from collections.abc import AsyncIterator
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
from perseus_server.domain.states import StreamEnd
from perseus_server.domain.values import FinishedRank, ReportAck
from perseus_server.grpc.codec import (
    PlanEncoder,
    decode_finish,
    decode_plan_request,
    decode_registration,
    encode_ack,
    encode_finished,
    encode_registered,
)
from perseus_server.grpc.gate import TooLargeMessage, token_matches
from perseus_server.grpc.received import WireReport
from perseus_server.runtime.hub import StreamLimitExceeded
from perseus_server.service import PerseusService
from perseus_server.service.credentials import Credentials

__all__ = ["PlanServicer", "status_code"]

_Context = grpc.aio.ServicerContext[Any, Any]


#: A refused report larger than this (bytes) has a garbage collection run (see
#: :meth:`PlanServicer._collect_refused`); at most one per ``COLLECT_INTERVAL`` seconds ...
LARGE_REFUSED_BYTES = 1 << 20
COLLECT_INTERVAL = 0.25
#: ... or sooner, once the refused reports not yet collected add up to this many bytes (so what
#: they hold is bounded by bytes, however fast they come; a collection per 16 MiB received).
COLLECT_REFUSED_BYTES = 16 << 20

#: The detail a stream replaced by a newer one for the same rank ends with (``ABORTED``).
REPLACED_DETAIL = "rank_id: replaced by a newer WatchPlan stream for this rank"


def status_code(err: ApiError) -> grpc.StatusCode:
    """The gRPC status code of an API error."""
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


class PlanServicer(pb_grpc.PlanServiceServicer):
    """RegisterRank, WatchPlan, ReportIterations and FinishRank."""

    def __init__(self, service: PerseusService, token: str | Credentials | None) -> None:
        self.service = service
        self.token = token
        self.encode_plan = PlanEncoder()
        self._collected = -math.inf
        self._refused_bytes = 0

    async def _abort(self, context: _Context, method: str, err: ApiError) -> NoReturn:
        code = status_code(err)
        self.service.metrics.grpc_calls.inc(method=method, code=code.name)
        detail = f"{err.field}: {err.detail}" if err.field else err.detail
        await context.abort(code, detail)
        raise AssertionError("unreachable")

    async def _auth(self, context: _Context, method: str) -> None:
        """The credential again.

        The interceptor checks it and its scope first, before any body is read.
        """
        if self.token is None or token_matches(context.invocation_metadata(), self.token):
            return
        await self._abort(
            context, method, Unauthorized("missing or wrong bearer token", field="authorization")
        )

    def _credential(self, context: _Context) -> str:
        """Who opens a stream, for the per-credential limit.

        An issued credential's id; the admin token, the shared token and an open server each
        count as one.
        """
        if isinstance(self.token, Credentials):
            who = self.token.from_metadata(context.invocation_metadata())
            if who is not None and who.credential_id:
                return f"credential:{who.credential_id}"
            return "admin"
        return "token" if self.token else "open"

    async def _size(self, context: _Context, method: str, request: Any) -> None:
        if isinstance(request, TooLargeMessage):
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            self.service.metrics.grpc_calls.inc(method=method, code=code.name)
            await context.abort(
                code, f"request: {request.size} bytes exceed this method's {request.limit}"
            )

    async def RegisterRank(
        self, request: pb.RegisterRankRequest, context: _Context
    ) -> pb.RegisterRankResponse:  # noqa: N802
        """Register a rank with its job; answers its rank id and the job's shape."""
        await self._auth(context, "RegisterRank")
        await self._size(context, "RegisterRank", request)
        try:
            resp = self.service.registration.register(decode_registration(request))
        except ApiError as e:
            await self._abort(context, "RegisterRank", e)
        self.service.metrics.grpc_calls.inc(method="RegisterRank", code="OK")
        return encode_registered(resp)

    # Streams through ``context.write`` (grpc.aio allows it), which the generated stub's
    # iterator-returning signature does not describe.
    async def WatchPlan(  # type: ignore[override]  # noqa: N802
        self, request: pb.WatchPlanRequest, context: _Context
    ) -> None:
        """Stream the rank's plan: the current one, then each new version."""
        await self._auth(context, "WatchPlan")
        await self._size(context, "WatchPlan", request)
        req = decode_plan_request(request)
        try:
            sub, first = self.service.registration.subscribe(
                req.job_id, req.rank_id, self._credential(context)
            )
        except ApiError as e:
            await self._abort(context, "WatchPlan", e)
        metrics = self.service.metrics
        try:
            last = -1
            if first is not None:
                sub.latest = None  # the current plan goes out now; don't send it twice
                await context.write(self.encode_plan(first))
                last = first.version
            while True:
                msg = await sub.next()
                if msg is None:
                    if sub.closed is StreamEnd.DELETED:
                        await self._abort(
                            context, "WatchPlan", NotFound("the job was deleted", field="job_id")
                        )
                    if sub.closed is StreamEnd.REPLACED:
                        metrics.grpc_calls.inc(method="WatchPlan", code="ABORTED")
                        await context.abort(grpc.StatusCode.ABORTED, REPLACED_DETAIL)
                    break
                if msg.version == last:
                    continue
                await context.write(self.encode_plan(msg))
                last = msg.version
                metrics.push_latency.observe(time.perf_counter() - sub.published_at)
        finally:
            self.service.registration.unsubscribe(sub)
        metrics.grpc_calls.inc(method="WatchPlan", code="OK")

    async def ReportIterations(
        self, request_iterator: AsyncIterator[pb.IterationReport], context: _Context
    ) -> pb.ReportAck:  # noqa: N802
        """Take a stream of iteration reports; answers how many were accepted and duplicates."""
        await self._auth(context, "ReportIterations")
        accepted = duplicates = 0
        async for report in request_iterator:
            try:
                new, dup = await self.service.ingest_report(WireReport.of(report))
                accepted, duplicates = accepted + new + dup, duplicates + dup
            except ApiError as e:
                size = report.ByteSize()
                if size > LARGE_REFUSED_BYTES:
                    self._collect_refused(size)
                await self._abort(context, "ReportIterations", e)
        self.service.metrics.grpc_calls.inc(method="ReportIterations", code="OK")
        return encode_ack(ReportAck(accepted, duplicates))

    def _collect_refused(self, size: int) -> None:
        """Free what earlier refused large reports left behind.

        An aborted stream leaves its last message in reference cycles inside the gRPC
        runtime until a full garbage collection (twenty refused reports of 100,000 transfers
        held 150 MiB, sixty 400 MiB); collected here, at most once per
        :data:`COLLECT_INTERVAL` seconds (a full collection takes tens of milliseconds) or
        per :data:`COLLECT_REFUSED_BYTES` refused, so refusals hold a bounded number of
        bytes however fast they come (with the interval alone, fast refusals of 4 MB reports
        held 86-103 MiB over forty).
        """
        now = time.monotonic()
        self._refused_bytes += size
        if (
            now - self._collected >= COLLECT_INTERVAL
            or self._refused_bytes >= COLLECT_REFUSED_BYTES
        ):
            self._collected, self._refused_bytes = now, 0
            gc.collect()

    async def FinishRank(
        self, request: pb.FinishRankRequest, context: _Context
    ) -> pb.FinishRankResponse:  # noqa: N802
        """Mark the rank finished; answers whether the whole job has finished."""
        await self._auth(context, "FinishRank")
        await self._size(context, "FinishRank", request)
        req = decode_finish(request)
        try:
            done, finished, registered = self.service.finish_rank(req.job_id, req.rank_id)
        except ApiError as e:
            await self._abort(context, "FinishRank", e)
        self.service.metrics.grpc_calls.inc(method="FinishRank", code="OK")
        return encode_finished(FinishedRank(done, finished, registered))
