"""The server's states, kinds and sources as string-valued enums.

Each is a :class:`enum.StrEnum`: a member *is* its string, so what the store holds, what the
REST API returns and what the metrics label with stay the plain strings they always were, while
mypy checks every comparison and assignment against the enum.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "DeploymentKind",
    "DetectorEvent",
    "JobActivity",
    "JobState",
    "ProfilingStatus",
    "ReplanKind",
    "SlowStageStatus",
    "SolveStatus",
    "StragglerSource",
    "StreamEnd",
]


class JobState(StrEnum):
    """Where a job stands (``GET /jobs/{id}`` ``state``), derived from its parts."""

    CREATED = "created"
    PROFILED = "profiled"
    PROFILING = "profiling"
    SOLVING = "solving"
    READY = "ready"
    FAILED = "failed"


class JobActivity(StrEnum):
    """A job's lifecycle (``GET /jobs/{id}`` ``lifecycle.state``).

    ``active`` while ranks are connected (and for ``Limits.idle_after_seconds`` after the last
    one left, or after it was created or the server started), then ``idle``; ``finished`` once
    ``POST /jobs/{id}/finish`` said so (until a rank connects again). Only active jobs share a
    cluster power budget.
    """

    ACTIVE = "active"
    IDLE = "idle"
    FINISHED = "finished"


class SolveStatus(StrEnum):
    """A job's frontier computation (``frontier_status``; stored in the ``frontiers`` table)."""

    NONE = "none"
    QUEUED = "queued"
    RUNNING = "running"
    #: Running, with the first plan stored and deployed as a frontier of one point.
    PARTIAL = "partial"
    DONE = "done"
    FAILED = "failed"

    @property
    def active(self) -> bool:
        """Whether a solve is still under way: queued, running or partial."""
        return self in (SolveStatus.QUEUED, SolveStatus.RUNNING, SolveStatus.PARTIAL)


class SlowStageStatus(StrEnum):
    """A pipeline's frontier re-solved for its slow stages."""

    SOLVING = "solving"
    READY = "ready"
    FAILED = "failed"


class ProfilingStatus(StrEnum):
    """An online-profiling session (its frequency scan, then the solve of what it measured)."""

    RUNNING = "running"
    SOLVING = "solving"
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"


class DeploymentKind(StrEnum):
    """What a deployment runs: frontier plans, a profiling clock step, or max clocks."""

    PLAN = "plan"
    PROFILING = "profiling"
    MAX_CLOCK = "max_clock"


class StragglerSource(StrEnum):
    """Why a pipeline counts as a straggler.

    ``detected``: its reported iteration times; ``reported``: ``POST /jobs/{id}/stragglers``;
    ``slow stage``: one of its stages is slow and its frontier was re-solved for it (the straggler
    is dropped when the stage recovers).
    """

    DETECTED = "detected"
    REPORTED = "reported"
    SLOW_STAGE = "slow stage"


class ReplanKind(StrEnum):
    """Why the plans were re-decided (the ``reason`` label of ``perseus_replans_total``)."""

    REPORTED = "reported"
    CLEARED = "cleared"
    DETECTED = "detected"
    PACE_CHANGED = "pace_changed"
    RECOVERED = "recovered"
    SLOW_STAGE = "slow_stage"
    SLOW_STAGE_RECOVERED = "slow_stage_recovered"
    SLOW_LINK = "slow_link"


class DetectorEvent(StrEnum):
    """What a straggler or stage detector concluded from one observation."""

    SLOW = "slow"
    CHANGED = "changed"
    RECOVERED = "recovered"


class StreamEnd(StrEnum):
    """Why the server ends a plan stream."""

    SHUTDOWN = "shutdown"
    DELETED = "deleted"
    #: A newer stream for the same rank took its place (a rank holds one stream).
    REPLACED = "replaced"
