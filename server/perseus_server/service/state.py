"""The in-memory state of the jobs (the store holds the durable copy), one part per concern.

A :class:`Job` is its stored row and schedule plus five parts: its profile, its frontier
computation, what is deployed, its stragglers and slow stages, and its ranks; and the online
profiling session when one ran. :class:`JobTable` holds the jobs by id.
"""

from __future__ import annotations

import functools
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from perseus.frontier import Frontier, plan_json
from perseus.profiles import Profile
from perseus.schedules import Schedule
from perseus_common.wire.values import PlanStep, PlanUpdate
from perseus_server.decisions.detectors import Detector, StageDetector, StragglerDetector
from perseus_server.decisions.link_fit import LinkCombiner
from perseus_server.decisions.planner import PlanPolicy, Straggler
from perseus_server.decisions.profiling_scan import ProfilingSession
from perseus_server.domain.errors import NotFound
from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import FrontierRow, JobRow
from perseus_server.domain.states import (
    DeploymentKind,
    JobState,
    ProfilingStatus,
    SlowStageStatus,
    SolveStatus,
)
from perseus_server.runtime.byte_bounded_cache import ByteBoundedCache

__all__ = [
    "Deployment",
    "DeploymentState",
    "FrontierState",
    "Job",
    "JobTable",
    "PlanSteps",
    "RankPlans",
    "ProfileState",
    "RankState",
    "SlowStages",
    "StragglerState",
    "LinkKey",
    "LinkState",
]

#: Per rank, its plan as the ranks run it (:meth:`perseus.frontier.Frontier.plan`).
RankPlans = tuple[tuple[PlanStep, ...], ...]
#: The JSON form of :data:`RankPlans`: ``{"instruction", "microbatch", "stage", "frequency"}``
#: per step (``GET /jobs/{id}/plan?steps=true``).
PlanSteps = list[list[dict[str, Any]]]


@dataclass(frozen=True)
class Deployment:
    """What a job's ranks run now.

    ``kind``: ``plan`` (frontier point ``indices[p]`` for pipeline ``p``), ``profiling`` (every
    instruction at ``profiling["frequency"]``) or ``max_clock`` (every instruction at
    ``max_clock``).
    """

    version: int
    kind: DeploymentKind
    reason: str
    indices: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()
    profiling: dict[str, int] | None = None
    max_clock: int = 0
    deployed_at: float = 0.0
    own: tuple[int, ...] = ()  # pipelines whose index is into their own re-solved frontier

    def to_json(self) -> dict[str, Any]:
        """The deployment as stored: kind, reasons, indices, own, profiling and max clock."""
        return {
            "kind": self.kind,
            "reason": self.reason,
            "own": list(self.own),
            "indices": list(self.indices),
            "reasons": list(self.reasons),
            "profiling": self.profiling,
            "max_clock": self.max_clock,
            "deployed_at": self.deployed_at,
        }

    @classmethod
    def from_json(cls, version: int, d: dict[str, Any]) -> Deployment:
        """Read :meth:`to_json`'s document as deployment ``version``."""
        return cls(
            version,
            DeploymentKind(d["kind"]),
            d["reason"],
            tuple(d.get("indices", ())),
            tuple(d.get("reasons", ())),
            d.get("profiling"),
            int(d.get("max_clock", 0)),
            float(d.get("deployed_at", 0.0)),
            tuple(int(p) for p in d.get("own", ())),
        )


@dataclass
class SlowStages:
    """A pipeline with slow stages or slow links, and the frontier re-solved for them.

    The stages' factors, the links' measured transfer times (s per microbatch, per ``(boundary,
    direction)``), and the frontier re-solved for them.
    """

    factors: dict[int, float]
    status: SlowStageStatus = SlowStageStatus.SOLVING
    frontier: Frontier | None = None
    solve_seconds: float = 0.0
    wall_seconds: float = 0.0
    error: str | None = None
    generation: int = 0
    #: Per-rank plans of the re-solved frontier's points the pipeline ran, by index.
    plans: dict[int, RankPlans] = field(default_factory=dict)
    links: dict[tuple[int, str], float] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        """Whether the re-solved frontier is ready."""
        return self.status is SlowStageStatus.READY and self.frontier is not None

    def describe(self) -> str:
        """The slow stages and links in words, for the plan's reason."""
        return ", ".join(
            [f"stage {s} x{f:.3g}" for s, f in sorted(self.factors.items())]
            + [f"link {b} {d} {t * 1e3:.4g} ms" for (b, d), t in sorted(self.links.items())]
        )

    def to_json(self) -> dict[str, Any]:
        """The slow stages as stored and shown: factors, links, the re-solve's status and times."""
        return {
            "factors": {str(k): v for k, v in self.factors.items()},
            "status": self.status,
            "solve_seconds": self.solve_seconds,
            "wall_seconds": self.wall_seconds,
            "error": self.error,
            "time": None if self.frontier is None else float(self.frontier.times[0]),
            "links": [
                {"boundary": b, "direction": d, "time": t}
                for (b, d), t in sorted(self.links.items())
            ],
        }


@dataclass
class ProfileState:
    """The job's profile, its revision and source, and a lookup of its times."""

    current: Profile | None = None
    revision: int = 0
    source: str = ""
    _times: dict[tuple[int, str], dict[int, float]] = field(default_factory=dict)

    def set(self, profile: Profile, revision: int, source: str) -> None:
        """Make ``profile`` the current one, of ``revision`` from ``source``."""
        self.current, self.revision, self.source = profile, revision, source
        self._times.clear()

    def time_of(self, stage: int, kind: str, mhz: int) -> float | None:
        """The profile's time of ``kind`` on ``stage`` at ``mhz`` (None when not profiled)."""
        if self.current is None:
            return None
        table = self._times.get((stage, kind))
        if table is None:
            entry = self.current.entries.get((stage, kind))
            if entry is None:
                return None
            table = {int(f): float(t) for f, t in zip(entry.frequencies, entry.times, strict=True)}
            self._times[(stage, kind)] = table
        return table.get(int(mhz))


#: Estimated bytes of per-rank plans cached per job.
PLANS_CACHE_BYTES = 64 * 1024 * 1024
#: Estimated size of one cached plan step (a :class:`PlanStep`, its clock and its slot in the
#: rank's tuple).
_STEP_BYTES = 128


def _plans_bytes(plans: RankPlans) -> int:
    return _STEP_BYTES * sum(len(rank) for rank in plans)


@dataclass
class FrontierState:
    """The frontier computation's row, the last computed frontier, and caches of its plans."""

    row: FrontierRow = field(default_factory=FrontierRow)
    current: Frontier | None = None
    plans_cache: ByteBoundedCache[int, RankPlans] = field(
        default_factory=lambda: ByteBoundedCache(PLANS_CACHE_BYTES, _plans_bytes, max_entries=64)
    )

    def set(self, frontier: Frontier) -> None:
        """Make ``frontier`` the current one; the cached plans are dropped."""
        self.current = frontier
        self.plans_cache.clear()

    def plan(self, index: int) -> RankPlans:
        """Every rank's plan at frontier point ``index`` (cached)."""
        plans = self.plans_cache.get(index)
        if plans is None:
            assert self.current is not None
            plans = self.current.plan(index)
            self.plans_cache[index] = plans
        return plans

    def steps(self, index: int) -> PlanSteps:
        """:meth:`plan` as JSON (a plan query caches the answer it is part of)."""
        return plan_json(self.plan(index))


@dataclass
class DeploymentState:
    """The version counter, what is deployed, the policy and pins behind it, and the rank messages.

    The messages are those built for the ranks, per version.
    """

    version: int = 0
    current: Deployment | None = None
    policy: PlanPolicy = field(default_factory=PlanPolicy)
    overrides: dict[int, int] = field(default_factory=dict)
    messages: dict[tuple[Any, ...], PlanUpdate] = field(default_factory=dict)

    @property
    def plan(self) -> Deployment | None:
        """The deployment when it runs frontier plans (not profiling, not max clocks)."""
        dep = self.current
        return dep if dep is not None and dep.kind is DeploymentKind.PLAN else None


#: A link of one pipeline: ``(pipeline, boundary, direction)``.
LinkKey = tuple[int, int, str]


@dataclass
class LinkState:
    """Measured P2P transfer times per pipeline and link, and the slow-link detector.

    See :mod:`perseus_server.service.slow_links`.
    """

    #: The latest per-iteration times (each a report's median) per link, for the status and the
    #: baseline of a link the profile has no time for.
    recent: dict[LinkKey, deque[float]] = field(default_factory=dict)
    #: The latest per-iteration fastest transfer per link (what detection compares).
    fastest: dict[LinkKey, deque[float]] = field(default_factory=dict)
    #: The baseline of a link the profile has no time for: the median of its first measured
    #: window's fastest transfers.
    baselines: dict[LinkKey, float] = field(default_factory=dict)
    #: Per link ``(boundary, direction)``, each pipeline's latest factor: the median of its last
    #: few fastest transfers over the baseline (the common mode's inputs).
    factors: dict[tuple[int, str], dict[int, float]] = field(default_factory=dict)
    #: Per link, the iteration its common mode was last taken at and the two smallest
    #: ``(factor, pipeline)`` then (so that each pipeline's is taken without itself).
    common: dict[tuple[int, str], tuple[int, tuple[tuple[float, int], ...]]] = field(
        default_factory=dict
    )
    #: Slow links and their measured time (s per microbatch).
    flags: dict[LinkKey, float] = field(default_factory=dict)
    #: Pipelines whose slow links changed while they dwelled after a replan (acted on after).
    pending: set[int] = field(default_factory=set)
    #: Per link detector key ``(pipeline, 2 * boundary + direction)``; built from the stage
    #: detector's settings (rebuilt when they change).
    detector: StageDetector | None = None
    #: The ends' times of each link per iteration (see :mod:`.link_fit`).
    combiner: LinkCombiner = field(default_factory=LinkCombiner)


@dataclass
class StragglerState:
    """Slow pipelines, their detectors, slow stages and their re-solves, recent replans."""

    stragglers: dict[int, Straggler] = field(default_factory=dict)
    detector: Detector = field(default_factory=StragglerDetector)
    stage_detector: StageDetector = field(default_factory=StageDetector)
    slow_stages: dict[int, SlowStages] = field(default_factory=dict)
    stage_flags: dict[tuple[int, int], float] = field(default_factory=dict)
    stage_pending: dict[int, int] = field(default_factory=dict)
    replans: list[dict[str, Any]] = field(default_factory=list)
    links: LinkState = field(default_factory=LinkState)


@dataclass
class RankState:
    """Registered ranks (by global rank and by id), their recent iterations, and pipelines' times.

    Each pipeline's recent iteration times are the slowest of its ranks'.
    """

    by_global: dict[int, RankInfo] = field(default_factory=dict)
    by_id: dict[str, RankInfo] = field(default_factory=dict)
    history: dict[str, deque[tuple[int, float, float, int]]] = field(default_factory=dict)
    pipeline_times: dict[int, OrderedDict[int, float]] = field(default_factory=dict)
    #: The highest report sequence accepted from each rank, per client incarnation:
    #: ``{rank_id: {incarnation: last}}``, least recently updated first (re-sent reports are not
    #: above it; see :mod:`perseus_server.service.reports`).
    last_sequence: dict[str, dict[int, int]] = field(default_factory=dict)
    #: Each rank's clock control as it last said: ``(state, reason)``, state ``active`` or
    #: ``unavailable`` (a rank that never said is absent).
    clock_control: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Each rank's power floors as it last said: ``(state, reason, plan_swing)``, state
    #: ``held`` or ``unavailable`` (a rank that never said is absent).
    power_floor: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    #: Per pipeline (``data_rank``), how many of its ranks registered (a rank's slot is fixed
    #: once registered, so a count only grows).
    per_pipeline: dict[int, int] = field(default_factory=dict)

    def add(self, rank: RankInfo) -> None:
        """Add (or replace) a registered rank."""
        if rank.global_rank not in self.by_global:
            self.per_pipeline[rank.data_rank] = self.per_pipeline.get(rank.data_rank, 0) + 1
        self.by_global[rank.global_rank] = rank
        self.by_id[rank.rank_id] = rank
        self.history.setdefault(rank.rank_id, deque(maxlen=32))

    def complete(self, width: int) -> int:
        """How many pipelines have all their ``width`` ranks (stages x tensor_parallel) registered."""
        return sum(1 for n in self.per_pipeline.values() if n >= width)


@dataclass
class Job:
    """One job's in-memory state."""

    row: JobRow
    schedule: Schedule
    profile: ProfileState = field(default_factory=ProfileState)
    frontier: FrontierState = field(default_factory=FrontierState)
    deployment: DeploymentState = field(default_factory=DeploymentState)
    stragglers: StragglerState = field(default_factory=StragglerState)
    ranks: RankState = field(default_factory=RankState)
    profiling: ProfilingSession | None = None

    @property
    def spec(self) -> JobSpec:
        """The job's description."""
        return self.row.spec

    @property
    def id(self) -> str:
        """The job's id."""
        return self.row.id

    @functools.cached_property
    def boundary_ends(self) -> tuple[tuple[int, int], ...]:
        """Per stage boundary ``b``, the pipeline ranks at its two ends.

        Boundary ``b`` is from model stage ``b`` to ``b + 1``.

        The ranks that run its producer and its consumer stage (the schedule does not change
        for the job's life).
        """
        where = self.schedule.stage_rank()
        return tuple((where[b], where[b + 1]) for b in range(self.schedule.stages - 1))

    def profiling_is(self, *statuses: ProfilingStatus) -> bool:
        """Whether online profiling is in one of ``statuses``."""
        return self.profiling is not None and self.profiling.status in statuses

    def state(self) -> JobState:
        """What the job is doing: profiling, solving, failed, ready, profiled or created."""
        if self.profiling_is(ProfilingStatus.RUNNING):
            return JobState.PROFILING
        st = self.frontier.row.status
        if st.active:
            return JobState.SOLVING
        if st is SolveStatus.FAILED:
            return JobState.FAILED
        if self.frontier.current is not None:
            return JobState.READY
        if self.profile.current is not None:
            return JobState.PROFILED
        return JobState.CREATED


class JobTable:
    """The jobs by id."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def get(self, job_id: str) -> Job:
        """The job; raises :class:`NotFound` naming ``job_id``."""
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job with id {job_id[:64]!r}", field="job_id")
        return job

    def find(self, job_id: str) -> Job | None:
        """The job, or None."""
        return self._jobs.get(job_id)

    def add(self, job: Job) -> None:
        """Add ``job``."""
        self._jobs[job.id] = job

    def remove(self, job_id: str) -> None:
        """Remove job ``job_id``."""
        del self._jobs[job_id]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(list(self._jobs.values()))

    def ids(self) -> list[str]:
        """Every job's id, in the order added."""
        return list(self._jobs)
