"""Plan fan-out: every open ``WatchPlan`` stream is a subscriber that always holds the newest
plan for its rank (older undelivered versions are simply replaced). Plans travel as the
service's plain :class:`~perseus_server.domain.values.PlanUpdate`; the gRPC adapter encodes
them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import StreamEnd

if TYPE_CHECKING:  # the service package imports this module
    from perseus_server.domain.values import PlanUpdate

__all__ = ["PlanHub", "Subscriber"]


@dataclass(eq=False)
class Subscriber:
    """One open stream: the rank it serves and the newest message waiting to be written."""

    rank: RankInfo
    event: asyncio.Event = field(default_factory=asyncio.Event)
    latest: PlanUpdate | None = None
    published_at: float = 0.0
    closed: StreamEnd | None = None  # why the stream must end

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

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscriber]] = {}

    def subscribe(self, rank: RankInfo) -> Subscriber:
        sub = Subscriber(rank)
        self._subs.setdefault(rank.job_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        subs = self._subs.get(sub.rank.job_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.rank.job_id]

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
        return {s.rank.rank_id for s in self._subs.get(job_id, ())}

    def connected_counts(self) -> dict[str, int]:
        return {j: len({s.rank.rank_id for s in subs}) for j, subs in self._subs.items()}
