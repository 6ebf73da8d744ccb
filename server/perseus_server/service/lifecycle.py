"""Jobs' lifecycles: ``active``, ``idle`` and ``finished``.

``active`` while ranks are connected, ``idle`` once none has been for ``Limits.idle_after_seconds``,
``finished`` on request (``POST /jobs/{id}/finish``) or once every registered rank said its training
ended cleanly (gRPC ``FinishRank``, which the client sends on a clean exit).

A job is ``active`` when it is created and, after a restart, when the server starts (its ranks
get ``idle_after_seconds`` to reconnect); a job stored ``idle`` or ``finished`` stays so until
a rank opens a plan stream again (it is then ``active``: a finished job whose ranks come back
is running after all). Every change is stored (so a restart keeps it), logged, and reported to
:attr:`Lifecycle.changed` (the power budget, which only shares its watts among the jobs that
:meth:`Lifecycle.drawing`: active, with a pipeline whose every rank is connected), as is a
pipeline's last rank registering.

The idle timeout needs no polling: when a job's last stream closes, a timer is set on the
event loop for ``idle_after_seconds`` later; a stream opened meanwhile makes the check a
no-op, and a check that finds the time not yet up sets the timer again. Durations are measured
on the monotonic clock (a step of the system clock neither freezes nor hastens the idle
timeout); the wall clock only dates the states shown (``since``, ``idle_at``). :meth:`Lifecycle.check` also runs on every read of a job's lifecycle, so a server
without a running loop (tests that drive the service directly) sees the same states.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perseus_server.domain.errors import Conflict
from perseus_server.domain.states import JobActivity
from perseus_server.service.budget_draw import counted_pipelines
from perseus_server.service.context import ServiceContext

__all__ = ["Lifecycle"]

log = logging.getLogger("perseus.server")

#: After a failed idle check (the store refused the change), the next one is this much later (s).
CHECK_RETRY_SECONDS = 1.0
#: A change of the wall clock against the monotonic one larger than this (s) is a step.
WALL_STEP_SECONDS = 1.0


@dataclass
class _Life:
    state: JobActivity
    #: When the state began (Unix seconds, shown).
    since: float
    reason: str
    #: When the job last had a connected rank (or was created, or the server started), on the
    #: monotonic clock (durations) ...
    last_seen: float
    #: ... and on the wall clock, read at the same moment (dates ``idle_at``, so every read of a
    #: job shows the same one).
    seen_at: float

    def seen(self, clock: float, wall: float) -> None:
        self.last_seen, self.seen_at = clock, wall

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "since": self.since, "reason": self.reason}


class Lifecycle:
    """Every job's lifecycle (see the module docstring)."""

    def __init__(
        self,
        ctx: ServiceContext,
        idle_after: float,
        changed: Callable[[str, JobActivity, str], None] = lambda job_id, state, why: None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """Track every job's lifecycle.

        ``changed``: called with (job id, new state, cause) after every change (the service
        recomputes the power budget). ``clock`` measures durations (monotonic), ``wall``
        dates the states.
        """
        self.ctx = ctx
        self.clock, self.wall = clock, wall
        self.idle_after = float(idle_after)
        self._jobs: dict[str, _Life] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        #: Per job, the ranks that said their training ended cleanly (since they connected).
        self._finished_ranks: dict[str, set[str]] = {}
        self.changed = changed

    # --- reading ---------------------------------------------------------------------------------

    def _life(self, job_id: str) -> _Life:
        life = self._jobs.get(job_id)
        if life is None:
            now = self.wall()
            life = self._jobs[job_id] = _Life(JobActivity.ACTIVE, now, "created", self.clock(), now)
        return life

    def state(self, job_id: str) -> JobActivity:
        """The job's lifecycle state."""
        return self._life(job_id).state

    def active(self, job_id: str) -> bool:
        """Whether the job is ``active``."""
        return self._life(job_id).state is JobActivity.ACTIVE

    def drawing(self, job_id: str) -> bool:
        """Whether the job draws on a power budget.

        It does when it is active and at least one of its pipelines has all its ranks
        connected (:mod:`perseus_server.service.budget_draw`); never from its creation alone,
        nor for a pipeline that cannot run.
        """
        return self.active(job_id) and counted_pipelines(self.ctx.jobs.get(job_id)) > 0

    def registered(self, job_id: str, why: str = "its first rank registered") -> None:
        """What the job draws changed (a pipeline became complete, a rank's power limit moved)."""
        self.changed(job_id, self.state(job_id), why)

    def view(self, job_id: str) -> dict[str, Any]:
        """``lifecycle`` of a job's view and status.

        State, since (Unix s), reason, and when it becomes idle if no rank connects
        (``idle_at``, None when it will not).
        """
        self.check(job_id)
        life = self._life(job_id)
        idle_at = None
        if life.state is JobActivity.ACTIVE and not self.ctx.hub.connected(job_id):
            # Dated on the wall clock as read when the job was last seen (every read shows the
            # same time), unless the wall clock stepped since: then on today's wall clock.
            offset, seen_offset = self.wall() - self.clock(), life.seen_at - life.last_seen
            if abs(offset - seen_offset) < WALL_STEP_SECONDS:
                offset = seen_offset
            idle_at = life.last_seen + self.idle_after + offset
        return {**life.to_json(), "idle_at": idle_at}

    def counts(self) -> dict[JobActivity, int]:
        """How many jobs are in each lifecycle state."""
        out = dict.fromkeys(JobActivity, 0)
        for job_id in self.ctx.jobs.ids():
            out[self.state(job_id)] += 1
        return out

    # --- changes ---------------------------------------------------------------------------------

    def _set(self, job_id: str, state: JobActivity, reason: str) -> None:
        life = self._life(job_id)
        if life.state is state:
            return
        now = self.wall()
        self.ctx.store.put_job_lifecycle(job_id, str(state), now, reason)  # stored, then kept
        life.state, life.since, life.reason = state, now, reason
        log.info("job %s: %s (%s)", job_id, state, reason)
        self.changed(job_id, state, reason)

    def load(self) -> None:
        """Load the lifecycles after a restart.

        Stored idle and finished jobs stay so; the others are active and their ranks have
        ``idle_after_seconds`` to reconnect.
        """
        stored = self.ctx.store.job_lifecycles()
        now, started = self.wall(), self.clock()
        for job_id in self.ctx.jobs.ids():
            state, since, reason = stored.get(job_id, ("active", now, "server started"))
            life = _Life(JobActivity(state), since, reason, started, now)
            self._jobs[job_id] = life
            if life.state is JobActivity.ACTIVE:
                self._arm(job_id)

    def added(self, job_id: str) -> None:
        """A new job: ``active`` from now (``created``), stored, and its idle timeout armed."""
        now = self.wall()
        self.ctx.store.put_job_lifecycle(job_id, "active", now, "created")
        self._jobs[job_id] = _Life(JobActivity.ACTIVE, now, "created", self.clock(), now)
        self._arm(job_id)

    def removed(self, job_id: str) -> None:
        """A deleted job: forget its lifecycle and cancel its idle timeout."""
        self._jobs.pop(job_id, None)
        self._finished_ranks.pop(job_id, None)
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()

    def rank_finished(self, job_id: str, rank_id: str) -> tuple[bool, int, int]:
        """``FinishRank``: the rank's training ended cleanly.

        Once every registered rank said so, the job is finished. Returns (finished, ranks
        that said so, ranks registered).
        """
        job = self.ctx.jobs.get(job_id)
        if rank_id not in job.ranks.by_id:
            raise Conflict(f"rank {rank_id!r} is not registered in job {job_id}", field="rank_id")
        done = self._finished_ranks.setdefault(job_id, set())
        done.add(rank_id)
        registered = len(job.ranks.by_id)
        if len(done) >= registered and self.state(job_id) is not JobActivity.FINISHED:
            self._set(job_id, JobActivity.FINISHED, f"all {registered} rank(s) finished cleanly")
        return self.state(job_id) is JobActivity.FINISHED, len(done), registered

    def connected(self, job_id: str, rank_id: str | None = None) -> None:
        """A rank of the job opened a plan stream (it is not finished any more)."""
        if rank_id is not None:
            self._finished_ranks.get(job_id, set()).discard(rank_id)
        life = self._life(job_id)
        life.seen(self.clock(), self.wall())
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        if life.state is not JobActivity.ACTIVE:
            self._set(job_id, JobActivity.ACTIVE, f"a rank connected (was {life.state})")

    def disconnected(self, job_id: str) -> None:
        """A plan stream of the job closed: with none left, the idle timer starts."""
        if job_id not in self.ctx.jobs or self.ctx.hub.connected(job_id):
            return
        self._life(job_id).seen(self.clock(), self.wall())
        self._arm(job_id)

    def finish(self, job_id: str) -> dict[str, Any]:
        """``POST /jobs/{id}/finish``: the job is done; it leaves the power budget at once."""
        self.ctx.jobs.get(job_id)  # 404
        if self.state(job_id) is JobActivity.FINISHED:
            raise Conflict("the job is already finished", field="job_id")
        connected = len(self.ctx.hub.connected(job_id))
        why = "finished on request" + (
            f" ({connected} rank(s) still connected)" if connected else ""
        )
        self._set(job_id, JobActivity.FINISHED, why)
        return self.view(job_id)

    def check(self, job_id: str | None = None) -> None:
        """Make active jobs without a connected rank for ``idle_after_seconds`` idle."""
        now = self.clock()
        for jid in [job_id] if job_id is not None else self.ctx.jobs.ids():
            if jid not in self.ctx.jobs:
                continue
            life = self._life(jid)
            if (
                life.state is JobActivity.ACTIVE
                and now - life.last_seen >= self.idle_after
                and not self.ctx.hub.connected(jid)
            ):
                self._set(jid, JobActivity.IDLE, f"no rank connected for {self.idle_after:g} s")

    def _arm(self, job_id: str, at_least: float = 0.0) -> None:
        """Check the job once its idle timeout has passed.

        Not before ``at_least`` seconds (when an event loop runs).
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # checked on read instead
        old = self._timers.pop(job_id, None)
        if old is not None:
            old.cancel()
        delay = max(at_least, self._life(job_id).last_seen + self.idle_after - self.clock())
        self._timers[job_id] = loop.call_later(delay + 0.01, self._fire, job_id)

    def _fire(self, job_id: str) -> None:
        self._timers.pop(job_id, None)
        retry = 0.0
        try:
            self.check(job_id)
        except Exception:  # a timer must never take the loop down
            log.exception("job %s: lifecycle check failed", job_id)
            retry = CHECK_RETRY_SECONDS
        life = self._jobs.get(job_id)
        if (
            life is not None
            and life.state is JobActivity.ACTIVE
            and job_id in self.ctx.jobs
            and not self.ctx.hub.connected(job_id)
        ):
            self._arm(job_id, retry)  # not yet (or the check failed): look again when due
