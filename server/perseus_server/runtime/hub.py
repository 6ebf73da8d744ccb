"""Plan fan-out to the open ``WatchPlan`` streams, each with the newest plan for its rank.

Every open ``WatchPlan`` stream is a subscriber that always holds the newest plan for its rank
(older undelivered versions are simply replaced). Plans travel as the service's plain
:class:`~perseus_common.wire.values.PlanUpdate`; the gRPC adapter encodes them.

**Bounded streams.** A rank identity holds one stream: a new stream for the same rank replaces
the old one, which ends (:attr:`StreamEnd.REPLACED`; the gRPC adapter ends it with ``ABORTED``
saying so). A credential holds at most ``max_streams_per_credential`` streams in all (the
gRPC adapter counts a tenant's credentials, its jobs' rank credentials included, as one); one more is
refused with :class:`StreamLimitExceeded` (``RESOURCE_EXHAUSTED`` naming the limit), unless it
replaces a stream of the same credential.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perseus_server.domain.errors import ApiError
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import StreamEnd

if TYPE_CHECKING:  # the service package imports this module
    from perseus_common.wire.values import PlanUpdate

__all__ = ["PlanHub", "StreamLimitExceeded", "Subscriber"]


class StreamLimitExceeded(ApiError):
    """A credential already holds as many ``WatchPlan`` streams as it may."""

    status = 429
    title = "Too many streams"


@dataclass(eq=False)
class Subscriber:
    """One open stream: the rank it serves and the newest message waiting to be written."""

    rank: RankInfo
    event: asyncio.Event = field(default_factory=asyncio.Event)
    latest: PlanUpdate | None = None
    published_at: float = 0.0
    closed: StreamEnd | None = None  # why the stream must end
    credential: str = ""  # who opened it (a credential id, or a name for shared tokens)
    counted: bool = False  # counted against its credential (until unsubscribed)

    async def next(self) -> PlanUpdate | None:
        """Wait for a message (or for the stream to be closed: then return None)."""
        while True:
            if self.closed is not None:
                return None
            if self.latest is not None:
                msg, self.latest = self.latest, None
                return msg
            self.event.clear()
            await self.event.wait()


class PlanHub:
    """Subscribers by job; :meth:`publish` hands each the message built for its rank."""

    def __init__(self, max_streams_per_credential: int = 65536) -> None:
        if max_streams_per_credential < 1:
            raise ValueError(
                f"max_streams_per_credential: must be >= 1, got {max_streams_per_credential}"
            )
        self.max_streams_per_credential = max_streams_per_credential
        self._subs: dict[str, set[Subscriber]] = {}
        self._by_rank: dict[str, Subscriber] = {}
        self._per_credential: dict[str, int] = {}

    def subscribe(self, rank: RankInfo, credential: str = "") -> Subscriber:
        """A new stream for ``rank``, opened with ``credential``.

        It replaces the rank's open stream (which ends, :attr:`StreamEnd.REPLACED`); raises
        :class:`StreamLimitExceeded` when ``credential`` holds its limit of streams already
        (see the module docstring).
        """
        old = self._by_rank.get(rank.rank_id)
        held = self._per_credential.get(credential, 0)
        frees = old is not None and old.credential == credential
        limit = self.max_streams_per_credential
        if held - frees >= limit:
            raise StreamLimitExceeded(
                f"this credential holds {held} WatchPlan streams, the limit "
                f"(max_streams_per_credential = {limit}; a tenant's rank credentials, one per "
                "job, count as one)",
                field="authorization",
            )
        if old is not None:
            old.closed = StreamEnd.REPLACED
            old.event.set()
            self.unsubscribe(old)
        sub = Subscriber(rank, credential=credential, counted=True)
        self._per_credential[credential] = self._per_credential.get(credential, 0) + 1
        self._by_rank[rank.rank_id] = sub
        self._subs.setdefault(rank.job_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """End ``sub``'s subscription; its credential's stream count goes down."""
        subs = self._subs.get(sub.rank.job_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.rank.job_id]
        if self._by_rank.get(sub.rank.rank_id) is sub:
            del self._by_rank[sub.rank.rank_id]
        if sub.counted:
            sub.counted = False
            left = self._per_credential[sub.credential] - 1
            if left:
                self._per_credential[sub.credential] = left
            else:
                del self._per_credential[sub.credential]

    def streams(self, credential: str) -> int:
        """Open streams of ``credential``."""
        return self._per_credential.get(credential, 0)

    def publish(self, job_id: str, build: Callable[[RankInfo], PlanUpdate | None]) -> int:
        """Give every subscriber of ``job_id`` its rank's message; returns how many."""
        now = time.perf_counter()
        subs = self._subs.get(job_id, ())
        for sub in subs:
            msg = build(sub.rank)
            if msg is not None:
                sub.latest = msg
                sub.published_at = now
                sub.event.set()
        return len(subs)

    def close(self, job_id: str | None, why: StreamEnd) -> None:
        """End the streams of one job (or of every job)."""
        groups = (
            [self._subs.get(job_id, set())] if job_id is not None else list(self._subs.values())
        )
        for subs in groups:
            for sub in subs:
                sub.closed = why
                sub.event.set()

    def connected(self, job_id: str) -> set[str]:
        """The rank ids with an open stream in job ``job_id``."""
        return {s.rank.rank_id for s in self._subs.get(job_id, ())}

    def connected_counts(self) -> dict[str, int]:
        """Per job, the number of ranks with an open stream."""
        return {j: len({s.rank.rank_id for s in subs}) for j, subs in self._subs.items()}
