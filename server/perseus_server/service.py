"""The Perseus service: jobs, profiles, frontier computations, plan deployment, ranks and
iteration reports. REST and gRPC are thin adapters over :class:`PerseusService`.

Everything runs on the server's event loop; solves run in worker processes (see
:mod:`perseus_server.solving`). State is written through to the :class:`Store` before a change is
acknowledged, so it survives a killed process.

Plan versions: each job has one version counter. Every deployment (a plan per data-parallel
pipeline, a profiling frequency step, or the max-clock plan while the profile of an online
profiling run is being solved) takes the next version and is pushed to every open stream.
A rank whose job has no deployment yet receives nothing until there is one (it runs at its
default clocks meanwhile).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import statistics
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from perseus.errors import InfeasibleError, ProfileError
from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import INSTRUCTION_KINDS, Profile, parse_profile_csv, parse_profile_json
from perseus.schedules import Schedule
from perseus_common.proto import perseus_pb2 as pb
from perseus_server.config import Limits
from perseus_server.errors import BadRequest, Conflict, NotFound
from perseus_server.hub import PlanHub, Subscriber
from perseus_server.jobs import JobSpec, RankInfo
from perseus_server.metrics import Metrics
from perseus_server.planner import PlanDecision, PlanPolicy, Straggler, decide, resolve_policy
from perseus_server.profiling import Measurement, ProfilingSession
from perseus_server.solving import SolveEvents, SolveManager
from perseus_server.store import FrontierRow, JobRow, Store
from perseus_server.stragglers import DetectorSettings, StageDetector, StragglerDetector

__all__ = ["PerseusService", "Deployment"]

log = logging.getLogger("perseus.server")


@dataclass(frozen=True)
class Deployment:
    """What a job's ranks run now.

    ``kind``: ``plan`` (frontier point ``indices[p]`` for pipeline ``p``), ``profiling`` (every
    instruction at ``profiling["frequency"]``) or ``max_clock`` (every instruction at
    ``max_clock``).
    """

    version: int
    kind: str
    reason: str
    indices: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()
    profiling: dict[str, int] | None = None
    max_clock: int = 0
    deployed_at: float = 0.0
    own: tuple[int, ...] = ()  # pipelines whose index is into their own re-solved frontier

    def to_json(self) -> dict[str, Any]:
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
        return cls(
            version,
            d["kind"],
            d["reason"],
            tuple(d.get("indices", ())),
            tuple(d.get("reasons", ())),
            d.get("profiling"),
            int(d.get("max_clock", 0)),
            float(d.get("deployed_at", 0.0)),
            tuple(int(p) for p in d.get("own", ())),
        )


@dataclass
class _SlowStages:
    """A pipeline with slow stages: their factors, and the frontier re-solved for them."""

    factors: dict[int, float]
    status: str = "solving"  # "solving" | "ready" | "failed"
    frontier: Frontier | None = None
    solve_seconds: float = 0.0
    wall_seconds: float = 0.0
    error: str | None = None
    generation: int = 0
    steps: list[list[dict[str, Any]]] | None = None

    def describe(self) -> str:
        return ", ".join(f"stage {s} x{f:.3g}" for s, f in sorted(self.factors.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "factors": {str(k): v for k, v in self.factors.items()},
            "status": self.status,
            "solve_seconds": self.solve_seconds,
            "wall_seconds": self.wall_seconds,
            "error": self.error,
            "time": None if self.frontier is None else float(self.frontier.times[0]),
        }


@dataclass
class _Job:
    """In-memory state of one job (the store holds the durable copy)."""

    row: JobRow
    schedule: Schedule
    profile: Profile | None = None
    profile_revision: int = 0
    profile_source: str = ""
    frontier_row: FrontierRow = field(default_factory=FrontierRow)
    frontier: Frontier | None = None
    version: int = 0
    deployment: Deployment | None = None
    policy: PlanPolicy = field(default_factory=PlanPolicy)
    overrides: dict[int, int] = field(default_factory=dict)
    stragglers: dict[int, Straggler] = field(default_factory=dict)
    detector: StragglerDetector = field(default_factory=StragglerDetector)
    stage_detector: StageDetector = field(default_factory=StageDetector)
    slow_stages: dict[int, _SlowStages] = field(default_factory=dict)
    stage_flags: dict[tuple[int, int], float] = field(default_factory=dict)
    stage_pending: dict[int, int] = field(default_factory=dict)
    profile_times: dict[tuple[int, str], dict[int, float]] = field(default_factory=dict)
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    by_id: dict[str, RankInfo] = field(default_factory=dict)
    history: dict[str, deque[tuple[int, float, float, int]]] = field(default_factory=dict)
    pipeline_times: dict[int, OrderedDict[int, float]] = field(default_factory=dict)
    profiling: ProfilingSession | None = None
    replans: list[dict[str, Any]] = field(default_factory=list)
    steps_cache: dict[int, list[list[dict[str, Any]]]] = field(default_factory=dict)
    msg_cache: dict[tuple[Any, ...], pb.PlanUpdate] = field(default_factory=dict)
    query_cache: OrderedDict[tuple[int, bool], bytes] = field(default_factory=OrderedDict)

    @property
    def spec(self) -> JobSpec:
        return self.row.spec

    @property
    def id(self) -> str:
        return self.row.id


class PerseusService:
    """The server's state and operations (see the module docstring)."""

    def __init__(self, store: Store, limits: Limits) -> None:
        self.store = store
        self.limits = limits
        self.hub = PlanHub()
        self.solver = SolveManager(limits.max_concurrent_solves)
        self.metrics = Metrics(self._jobs_gauge, self._connected_gauge, self._registered_gauge)
        self._jobs: dict[str, _Job] = {}
        self._started = time.time()
        self._background: set[asyncio.Task[None]] = set()

    # --- lifecycle -------------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the in-memory state from the store; solves cut short by a restart are failed."""
        for job_id in self.store.interrupted_solves():
            frow = self.store.frontier(job_id)
            frow.status, frow.error, frow.finished = (
                "failed",
                "interrupted: the server restarted during the computation",
                time.time(),
            )
            self.store.put_frontier(job_id, frow)
        for row in self.store.jobs():
            job = _Job(row=row, schedule=row.spec.build_schedule())
            prof = self.store.profile(row.id)
            if prof is not None:
                job.profile = parse_profile_csv(prof[0])
                job.profile_revision, job.profile_source = prof[1], prof[2]
            job.frontier_row = self.store.frontier(row.id)
            if job.frontier_row.doc:
                job.frontier = Frontier.from_json(json.loads(job.frontier_row.doc))
            dep = self.store.deployment(row.id)
            if dep is not None:
                version, doc = dep
                job.version = version
                job.deployment = (
                    Deployment.from_json(version, doc["deployment"])
                    if "deployment" in doc
                    else None
                )
                job.policy = PlanPolicy.from_json(doc.get("policy"))
                job.overrides = {int(k): int(v) for k, v in doc.get("overrides", {}).items()}
                job.stragglers = {
                    int(s["pipeline"]): Straggler(int(s["pipeline"]), float(s["time"]), s["source"])
                    for s in doc.get("stragglers", [])
                }
                settings = DetectorSettings(**doc.get("detector", {}))
                job.detector = StragglerDetector(settings)
                job.stage_detector = StageDetector(settings)
                for key, ss in doc.get("slow_stages", {}).items():
                    state = _SlowStages(
                        {int(k): float(v) for k, v in ss["factors"].items()},
                        status="ready",
                        frontier=Frontier.from_json(ss["frontier"]),
                        solve_seconds=float(ss.get("solve_seconds", 0.0)),
                        wall_seconds=float(ss.get("wall_seconds", 0.0)),
                    )
                    job.slow_stages[int(key)] = state
                    for st, f in state.factors.items():
                        job.stage_flags[(int(key), st)] = f
            for r in self.store.ranks(row.id):
                job.ranks[r.global_rank] = r
                job.by_id[r.rank_id] = r
                job.history[r.rank_id] = deque(self.store.iterations(r.rank_id, 32), maxlen=32)
            prof_doc = self.store.profiling(row.id)
            if prof_doc is not None:
                job.profiling = ProfilingSession.from_json(prof_doc)
            self._jobs[row.id] = job
        for job in self._jobs.values():
            if (
                job.profiling is not None
                and job.profiling.status == "solving"
                and job.frontier_row.status != "done"
            ):
                job.profiling.status = "failed"
                job.profiling.error = (
                    "interrupted: the server restarted while solving the measured profile"
                )
                self.store.put_profiling(job.id, job.profiling.to_json())

    async def shutdown(self) -> None:
        self.hub.close(None, "shutdown")
        await self.solver.shutdown()

    # --- helpers ---------------------------------------------------------------------------------

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job with id {job_id!r}", field="job_id")
        return job

    def _state(self, job: _Job) -> str:
        if job.profiling is not None and job.profiling.status == "running":
            return "profiling"
        st = job.frontier_row.status
        if st in ("queued", "running"):
            return "solving"
        if st == "failed":
            return "failed"
        if job.frontier is not None:
            return "ready"
        if job.profile is not None:
            return "profiled"
        return "created"

    def _jobs_gauge(self) -> dict[Any, float]:
        counts: dict[Any, float] = {}
        for job in self._jobs.values():
            key = (("state", self._state(job)),)
            counts[key] = counts.get(key, 0) + 1
        return counts or {(("state", "created"),): 0}

    def _connected_gauge(self) -> dict[Any, float]:
        return {(("job", j),): float(n) for j, n in self.hub.connected_counts().items()}

    def _registered_gauge(self) -> dict[Any, float]:
        return {(("job", j.id),): float(len(j.ranks)) for j in self._jobs.values() if j.ranks}

    # --- jobs ------------------------------------------------------------------------------------

    def create_job(self, spec: JobSpec) -> dict[str, Any]:
        if len(self._jobs) >= self.limits.max_jobs:
            raise Conflict(
                f"the server holds its maximum of {self.limits.max_jobs} jobs; delete one first",
                field="job_id",
            )
        schedule = spec.validate(self.limits)
        job_id = secrets.token_hex(8)
        row = self.store.add_job(job_id, spec)
        self._jobs[job_id] = _Job(row=row, schedule=schedule)
        return self.job_view(job_id)

    def list_jobs(self) -> list[dict[str, Any]]:
        return [self.job_view(j) for j in self._jobs]

    def job_view(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        dep = job.deployment
        return {
            "id": job.id,
            "created": job.row.created,
            "state": self._state(job),
            **job.spec.to_json(),
            "instructions": job.schedule.num_instructions,
            "world_size": job.spec.world_size,
            "profile": None
            if job.profile is None
            else {"revision": job.profile_revision, "source": job.profile_source},
            "frontier_status": job.frontier_row.status,
            "plan_version": job.version if dep is not None else 0,
        }

    async def delete_job(self, job_id: str) -> None:
        job = self._job(job_id)
        self.solver.cancel(job_id, "the job was deleted")
        for p in list(job.slow_stages):
            self.solver.cancel(self._stage_solve_key(job, p), "the job was deleted")
        self.hub.close(job_id, "deleted")
        del self._jobs[job_id]
        self.store.delete_job(job.id)

    # --- profiles --------------------------------------------------------------------------------

    async def put_profile(self, job_id: str, body: bytes, content_type: str) -> dict[str, Any]:
        job = self._job(job_id)
        if self.solver.is_active(job_id):
            raise Conflict(
                "a frontier computation is running; cancel it (DELETE /jobs/{id}/frontier) first",
                field="profile",
            )
        if job.profiling is not None and job.profiling.status in ("running", "solving"):
            raise Conflict(
                "online profiling is running; it will store the profile itself", field="profile"
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8 text", field="profile") from None
        is_json = "json" in content_type or text.lstrip().startswith(("{", "["))
        schedule, bp = job.schedule, job.spec.blocking_power

        def parse() -> Profile:
            prof = parse_profile_json(text) if is_json else parse_profile_csv(text)
            EnergyProblem.build(prof, schedule, bp)  # the profile must cover the job's schedule
            return prof

        try:
            profile = await asyncio.to_thread(parse)
        except ProfileError as e:
            extra = {"row": e.row} if e.row is not None else {}
            raise BadRequest(
                str(e), field=f"profile.{e.field}" if e.field else "profile", **extra
            ) from None
        self._check_clocks(job, profile, list(job.ranks.values()))
        return self._store_profile(job, profile, "upload")

    def _store_profile(self, job: _Job, profile: Profile, source: str) -> dict[str, Any]:
        rev = self.store.put_profile(job.id, profile.to_csv(), source)
        job.profile, job.profile_revision, job.profile_source = profile, rev, source
        return self.profile_summary(job.id)

    def profile_summary(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        if job.profile is None:
            raise NotFound(
                "the job has no profile yet; PUT /jobs/{id}/profile or run online profiling",
                field="profile",
            )
        return {
            "revision": job.profile_revision,
            "source": job.profile_source,
            "stages": job.profile.stages,
            "instructions": list(job.profile.kinds),
            "frequencies": job.profile.frequencies,
            "rows": sum(1 for _ in job.profile.records()),
        }

    def get_profile(self, job_id: str) -> Profile:
        job = self._job(job_id)
        if job.profile is None:
            raise NotFound(
                "the job has no profile yet; PUT /jobs/{id}/profile or run online profiling",
                field="profile",
            )
        return job.profile

    def _rank_stages(self, job: _Job, pipeline_rank: int) -> set[int]:
        """Profile stages a rank runs (model stages, or the rank itself for a per-rank profile)."""
        if job.profile is not None and job.profile.stages == job.schedule.ranks:
            return {pipeline_rank}
        return {op.stage for op in job.schedule.orders[pipeline_rank]}

    def _check_clocks(self, job: _Job, profile: Profile, ranks: list[RankInfo]) -> None:
        for r in ranks:
            if not r.supported_clocks:
                continue
            supported = set(r.supported_clocks)
            stages = (
                {r.pipeline_rank}
                if profile.stages == job.schedule.ranks
                else {op.stage for op in job.schedule.orders[r.pipeline_rank]}
            )
            for (s, _), p in profile.entries.items():
                if s in stages:
                    bad = sorted({int(f) for f in p.frequencies} - supported)
                    if bad:
                        raise BadRequest(
                            f"stage {s} uses {bad[:5]} MHz, which rank {r.global_rank} ({r.gpu_name or 'its GPU'}) does not support",
                            field="profile.frequency",
                        )

    # --- frontier --------------------------------------------------------------------------------

    def start_frontier(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        if job.profile is None:
            raise Conflict(
                "the job has no profile yet; PUT /jobs/{id}/profile first", field="profile"
            )
        if self.solver.is_active(job_id):
            raise Conflict(
                "a frontier computation is already running for this job", field="frontier"
            )
        if job.profiling is not None and job.profiling.status == "running":
            raise Conflict(
                "online profiling is running; the frontier is computed when it ends",
                field="frontier",
            )
        self._launch_solve(job)
        return self.frontier_status(job_id, points=False)

    def _launch_solve(self, job: _Job) -> None:
        assert job.profile is not None
        row = job.frontier_row
        row.status, row.progress, row.error = "queued", 0.0, None
        row.started, row.finished, row.profile_revision = time.time(), None, job.profile_revision
        self.store.put_frontier(job.id, row)
        revision = job.profile_revision
        t0 = time.perf_counter()

        def on_running(pid: int) -> None:
            if job.id in self._jobs:
                row.status = "running"
                self.store.put_frontier(job.id, row)

        def on_progress(fraction: float) -> None:
            row.progress = max(
                row.progress, min(1.0, fraction)
            )  # kept in memory; stored at the end

        def on_done(doc: str, seconds: float) -> None:
            if job.id not in self._jobs:
                return
            try:
                frontier = Frontier.from_json(json.loads(doc))
            except Exception as e:  # noqa: BLE001
                on_failed(f"the solver returned an unreadable frontier: {e}")
                return
            row.status, row.progress, row.error, row.doc = "done", 1.0, None, doc
            row.finished, row.solve_seconds, row.profile_revision = time.time(), seconds, revision
            self.store.put_frontier(job.id, row)
            job.frontier = frontier
            job.steps_cache.clear()
            job.query_cache.clear()
            self.metrics.solves.inc(outcome="done")
            self.metrics.solve_seconds.observe(time.perf_counter() - t0)
            if job.profiling is not None and job.profiling.status == "solving":
                job.profiling.status = "done"
                self.store.put_profiling(job.id, job.profiling.to_json())
            # Default policy after a solve: the fastest plan (point 0), deployed at once.
            job.policy, job.overrides = PlanPolicy(), {}
            self._deploy_decision(job, "frontier computed")

        def on_failed(reason: str) -> None:
            if job.id not in self._jobs:
                return
            row.status, row.error, row.finished = "failed", reason, time.time()
            self.store.put_frontier(job.id, row)
            self.metrics.solves.inc(outcome="cancelled" if "cancel" in reason else "failed")
            log.warning("job %s: frontier computation failed: %s", job.id, reason)
            if job.profiling is not None and job.profiling.status == "solving":
                job.profiling.status, job.profiling.error = (
                    "failed",
                    f"solving the measured profile failed: {reason}",
                )
                self.store.put_profiling(job.id, job.profiling.to_json())

        self.solver.start(
            job.id,
            job.profile.to_csv(),
            job.schedule.to_json(),
            job.spec.blocking_power,
            SolveEvents(on_running, on_progress, on_done, on_failed),
        )

    def cancel_frontier(self, job_id: str) -> dict[str, Any]:
        self._job(job_id)
        if not self.solver.cancel(job_id, "cancelled by request"):
            raise Conflict("no frontier computation is running for this job", field="frontier")
        return self.frontier_status(job_id, points=False)

    def frontier_status(self, job_id: str, *, points: bool = True) -> dict[str, Any]:
        job = self._job(job_id)
        row = job.frontier_row
        out: dict[str, Any] = {
            "status": row.status,
            "progress": row.progress,
            "error": row.error,
            "started": row.started,
            "finished": row.finished,
            "solve_seconds": row.solve_seconds,
            "worker_pid": self.solver.worker_pid(job_id),
            "stale": job.frontier is not None and row.profile_revision != job.profile_revision,
        }
        f = job.frontier
        if f is not None:
            out.update(
                num_points=len(f),
                max_frequency_time=f.max_frequency_time,
                max_frequency_energy=f.max_frequency_energy,
            )
            if points:
                out["points"] = [
                    {"index": i, "time": float(t), "energy": float(e), "lower_bound": float(lb)}
                    for i, (t, e, lb) in enumerate(
                        zip(f.times, f.energies, f.lower_bounds, strict=True)
                    )
                ]
        return out

    def frontier_of(self, job_id: str) -> tuple[Frontier, list[int]]:
        job = self._job(job_id)
        if job.frontier is None:
            raise Conflict(
                "the job has no frontier yet; POST /jobs/{id}/frontier first", field="frontier"
            )
        idx = (
            list(job.deployment.indices)
            if job.deployment is not None and job.deployment.kind == "plan"
            else []
        )
        return job.frontier, idx

    # --- plans -----------------------------------------------------------------------------------

    def _steps(self, job: _Job, index: int) -> list[list[dict[str, Any]]]:
        steps = job.steps_cache.get(index)
        if steps is None:
            assert job.frontier is not None
            steps = job.frontier.plan_steps(index)
            if len(job.steps_cache) > 64:
                job.steps_cache.clear()
            job.steps_cache[index] = steps
        return steps

    def query_plan(self, job_id: str, policy: PlanPolicy, *, steps: bool = False) -> bytes:
        """The plan ``policy`` selects as a JSON document (bytes, cached per frontier point)."""
        job = self._job(job_id)
        frontier, _ = self.frontier_of(job_id)
        try:
            index = resolve_policy(frontier, policy)
        except InfeasibleError as e:
            raise BadRequest(
                str(e), field=policy.kind if policy.kind != "index" else "index"
            ) from None
        key = (index, steps)
        cached = job.query_cache.get(key)
        if cached is not None:
            return cached
        body = json.dumps(self._plan_doc(job, index, steps=steps)).encode()
        job.query_cache[key] = body
        if len(job.query_cache) > 256:
            job.query_cache.popitem(last=False)
        return body

    def _plan_doc(self, job: _Job, index: int, *, steps: bool) -> dict[str, Any]:
        f = job.frontier
        assert f is not None
        plan = self._steps(job, index)
        doc: dict[str, Any] = {
            "index": index,
            "time": float(f.times[index]),
            "energy": float(f.energies[index]),
            "lower_bound": float(f.lower_bounds[index]),
            "max_frequency_time": f.max_frequency_time,
            "max_frequency_energy": f.max_frequency_energy,
            "slowdown": float(f.times[index]) / f.max_frequency_time - 1.0,
            "energy_savings": 1.0 - float(f.energies[index]) / f.max_frequency_energy,
            "frequencies": [[s["frequency"] for s in rank] for rank in plan],
        }
        if steps:
            doc["steps"] = plan
        return doc

    def deploy(
        self, job_id: str, policy: PlanPolicy, pipelines: list[int] | None
    ) -> dict[str, Any]:
        """``PUT /jobs/{id}/plan``: set the default policy (or pin some pipelines) and push."""
        job = self._job(job_id)
        frontier, _ = self.frontier_of(job_id)
        if job.profiling is not None and job.profiling.status == "running":
            raise Conflict(
                "online profiling is running; abort it (DELETE /jobs/{id}/profiling) first",
                field="profiling",
            )
        try:
            index = resolve_policy(frontier, policy)
        except InfeasibleError as e:
            raise BadRequest(str(e), field=policy.kind) from None
        if pipelines is not None:
            bad = [p for p in pipelines if not (0 <= p < job.spec.data_parallel)]
            if bad or not pipelines:
                raise BadRequest(
                    f"pipelines must be a non-empty list of indices in 0..{job.spec.data_parallel - 1}",
                    field="pipelines",
                )
            overrides = dict(job.overrides)
            overrides.update({p: index for p in pipelines})
            job.overrides = overrides
        else:
            job.policy, job.overrides = policy, {}
        self._deploy_decision(job, "selected through PUT /plan", force=True)
        view = self.deployment_view(job_id)
        assert view is not None  # just deployed
        return view

    def _deploy_decision(self, job: _Job, cause: str, *, force: bool = False) -> bool:
        """Re-decide every pipeline's plan and push it when it changed (or when ``force``)."""
        assert job.frontier is not None
        resolved = {
            p: (st.frontier, st.describe())
            for p, st in job.slow_stages.items()
            if st.status == "ready" and st.frontier is not None
        }
        try:
            decision: PlanDecision = decide(
                job.frontier,
                job.policy,
                job.spec.data_parallel,
                job.stragglers,
                job.overrides,
                resolved,
            )
        except InfeasibleError:
            job.policy = PlanPolicy()
            decision = decide(
                job.frontier,
                job.policy,
                job.spec.data_parallel,
                job.stragglers,
                job.overrides,
                resolved,
            )
        own = tuple(p for p, plan in enumerate(decision.plans) if plan.own)
        dep = job.deployment
        same = (
            dep is not None
            and dep.kind == "plan"
            and list(dep.indices) == decision.indices()
            and dep.own == own
            and list(dep.reasons) == [p.reason for p in decision.plans]
        )
        if same and not force:
            return False
        self._publish(
            job,
            Deployment(
                version=job.version + 1,
                kind="plan",
                reason=decision.reason,
                indices=tuple(decision.indices()),
                reasons=tuple(p.reason for p in decision.plans),
                deployed_at=time.time(),
                own=own,
            ),
            cause,
        )
        return True

    def _persist_deployment(self, job: _Job) -> None:
        doc = {
            "deployment": job.deployment.to_json() if job.deployment is not None else None,
            "policy": job.policy.to_json(),
            "overrides": {str(k): v for k, v in job.overrides.items()},
            "stragglers": [
                {"pipeline": s.pipeline, "time": s.time, "source": s.source}
                for s in job.stragglers.values()
            ],
            "detector": job.detector.settings.to_json(),
            "slow_stages": {
                str(p): {
                    **st.to_json(),
                    "frontier": st.frontier.to_json(compact=True),
                }
                for p, st in job.slow_stages.items()
                if st.status == "ready" and st.frontier is not None
            },
        }
        if doc["deployment"] is None:
            del doc["deployment"]
        self.store.put_deployment(job.id, job.version, doc)

    def _publish(self, job: _Job, dep: Deployment, cause: str) -> None:
        job.version = dep.version
        job.deployment = dep
        job.msg_cache.clear()
        self._persist_deployment(job)
        self.metrics.deploys.inc(kind=dep.kind)
        log.info("job %s: plan version %d (%s): %s", job.id, dep.version, cause, dep.reason)
        self.hub.publish(job.id, lambda rank: self._message(job, rank))

    def _message(self, job: _Job, rank: RankInfo) -> pb.PlanUpdate | None:
        """The newest PlanUpdate for ``rank`` (cached per version, pipeline plan and stage)."""
        dep = job.deployment
        if dep is None:
            return None
        if dep.kind == "plan":
            p = min(rank.data_rank, len(dep.indices) - 1)
            index = dep.indices[p]
            key: tuple[Any, ...] = (
                dep.version,
                index,
                dep.reasons[p],
                rank.pipeline_rank,
                p if p in dep.own else -1,
            )
        else:
            key = (dep.version, rank.pipeline_rank)
        msg = job.msg_cache.get(key)
        if msg is not None:
            return msg
        if dep.kind == "plan":
            frontier, all_steps = self._pipeline_plan(job, dep, p)
            steps = all_steps[rank.pipeline_rank]
            msg = pb.PlanUpdate(
                version=dep.version,
                reason=dep.reasons[p],
                expected_iteration_time=float(frontier.times[index]),
                steps=[
                    pb.PlanStep(
                        instruction=s["instruction"],
                        microbatch=s["microbatch"],
                        frequency_mhz=s["frequency"],
                        stage=s["stage"],
                    )
                    for s in steps
                ],
            )
        else:
            prof = dep.profiling or {}
            freq = prof.get("frequency", dep.max_clock)
            msg = pb.PlanUpdate(
                version=dep.version,
                reason=dep.reason,
                steps=[
                    pb.PlanStep(
                        instruction=op.kind,
                        microbatch=op.microbatch,
                        frequency_mhz=freq,
                        stage=op.stage,
                    )
                    for op in job.schedule.orders[rank.pipeline_rank]
                ],
            )
            if dep.kind == "profiling":
                msg.profiling.CopyFrom(
                    pb.ProfilingTask(
                        frequency_mhz=freq,
                        warmup_iterations=prof["warmup_iterations"],
                        iterations=prof["iterations"],
                    )
                )
        job.msg_cache[key] = msg
        return msg

    def _pipeline_frontier(self, job: _Job, dep: Deployment, p: int) -> Frontier:
        """The frontier pipeline ``p``'s index in ``dep`` refers to."""
        if p in dep.own:
            st = job.slow_stages.get(p)
            if st is not None and st.frontier is not None:
                return st.frontier
        assert job.frontier is not None
        return job.frontier

    def _pipeline_plan(
        self, job: _Job, dep: Deployment, p: int
    ) -> tuple[Frontier, list[list[dict[str, Any]]]]:
        """Pipeline ``p``'s frontier and per-rank plan steps under ``dep``."""
        index = dep.indices[p]
        if p in dep.own:
            st = job.slow_stages.get(p)
            if st is not None and st.frontier is not None:
                if st.steps is None:
                    st.steps = st.frontier.plan_steps(0)
                return st.frontier, st.steps
        assert job.frontier is not None
        return job.frontier, self._steps(job, index)

    def deployment_view(self, job_id: str) -> dict[str, Any] | None:
        job = self._job(job_id)
        dep = job.deployment
        if dep is None:
            return None
        out: dict[str, Any] = {
            "version": dep.version,
            "kind": dep.kind,
            "reason": dep.reason,
            "deployed_at": dep.deployed_at,
            "policy": job.policy.to_json(),
        }
        if dep.kind == "plan" and job.frontier is not None:
            out["pipelines"] = []
            for p, i in enumerate(dep.indices):
                f = self._pipeline_frontier(job, dep, p)
                out["pipelines"].append(
                    {
                        "pipeline": p,
                        "index": i,
                        "frontier": "re-solved for its slow stage(s)" if p in dep.own else "job",
                        "time": float(f.times[i]),
                        "energy": float(f.energies[i]),
                        "reason": dep.reasons[p],
                    }
                )
        elif dep.kind == "profiling":
            out["profiling"] = dep.profiling
        else:
            out["frequency"] = dep.max_clock
        return out

    # --- stragglers ------------------------------------------------------------------------------

    def report_straggler(
        self, job_id: str, pipeline: int, slowdown: float | None, iteration_time: float | None
    ) -> dict[str, Any]:
        job = self._job(job_id)
        frontier, _ = self.frontier_of(job_id)
        if not (0 <= pipeline < job.spec.data_parallel):
            raise BadRequest(
                f"must be between 0 and {job.spec.data_parallel - 1}, got {pipeline}",
                field="pipeline",
            )
        if (slowdown is None) == (iteration_time is None):
            raise BadRequest("give exactly one of slowdown and iteration_time", field="slowdown")
        if slowdown is not None:
            if not (math.isfinite(slowdown) and 0 < slowdown <= 100):
                raise BadRequest(
                    f"must be a number in (0, 100], got {slowdown!r}", field="slowdown"
                )
            base = float(frontier.times[resolve_policy(frontier, job.policy)])
            t = base * (1 + slowdown)
        else:
            assert iteration_time is not None
            if not (math.isfinite(iteration_time) and 0 < iteration_time <= 1e6):
                raise BadRequest(
                    f"must be a positive number of seconds, got {iteration_time!r}",
                    field="iteration_time",
                )
            t = iteration_time
        job.stragglers = {**job.stragglers, pipeline: Straggler(pipeline, t, "reported")}
        self._replan(
            job, f"pipeline {pipeline} reported slow ({t:.4g} s per iteration)", "reported"
        )
        return self.status(job_id)

    def clear_stragglers(self, job_id: str, pipeline: int | None) -> dict[str, Any]:
        job = self._job(job_id)
        self.frontier_of(job_id)
        if (
            pipeline is not None
            and pipeline not in job.stragglers
            and pipeline not in job.slow_stages
        ):
            raise NotFound(f"pipeline {pipeline} is not marked as a straggler", field="pipeline")
        job.stragglers = (
            {} if pipeline is None else {p: s for p, s in job.stragglers.items() if p != pipeline}
        )
        job.detector.reset(pipeline)
        job.stage_detector.reset(pipeline)
        for p in list(job.slow_stages) if pipeline is None else [pipeline]:
            self._drop_slow_stages(job, p)
        self._replan(
            job,
            "straggler(s) cleared" if pipeline is None else f"pipeline {pipeline} cleared",
            "cleared",
        )
        return self.status(job_id)

    def _replan(self, job: _Job, why: str, kind: str) -> None:
        changed = self._deploy_decision(job, why)
        if not changed:
            self._persist_deployment(job)
        self.metrics.replans.inc(kind=kind)
        job.replans.append(
            {"time": time.time(), "why": why, "version": job.version, "changed": changed}
        )
        del job.replans[:-20]
        log.info("job %s: replan (%s): %s", job.id, kind, why)

    def set_detector(self, job_id: str, settings: DetectorSettings) -> None:
        job = self._job(job_id)
        job.detector = StragglerDetector(settings)
        job.stage_detector = StageDetector(settings)
        if job.deployment is not None or job.frontier is not None:
            self._persist_deployment(job)

    def _detect(
        self, job: _Job, rank: RankInfo, iteration: int, seconds: float, version: int
    ) -> None:
        dep = job.deployment
        if dep is None or dep.kind != "plan" or version != dep.version or job.frontier is None:
            return
        p = rank.data_rank
        leader = min((r.global_rank for r in job.ranks.values() if r.data_rank == p), default=None)
        if rank.global_rank != leader:
            return
        expected = float(self._pipeline_frontier(job, dep, p).times[dep.indices[p]])
        current = job.stragglers.get(p)
        flagged = current is not None or p in job.slow_stages
        known = (
            current.time * job.detector.calibration()
            if current is not None and current.source == "detected"
            else None
        )
        event, t_prime = job.detector.observe(p, seconds, expected, flagged, known)
        if event in ("slow", "changed"):
            c = job.detector.calibration()
            on_axis = f"T'={t_prime / c:.4g} s on the profile's axis"
            if event == "slow":
                why = (
                    f"pipeline {p} detected slow: {t_prime:.4g} s per iteration vs "
                    f"{expected:.4g} s planned (x{c:.3f} common overhead: {on_axis})"
                )
            else:  # a detected straggler's pace moved: known is its old T'
                why = (
                    f"pipeline {p} pace changed: {t_prime:.4g} s per iteration, was "
                    f"{known:.4g} s ({on_axis})"
                )
            job.stragglers = {**job.stragglers, p: Straggler(p, t_prime / c, "detected")}
            self._replan(job, why, "detected" if event == "slow" else "pace_changed")
        elif event == "recovered" and current is not None and current.source == "detected":
            job.stragglers = {q: s for q, s in job.stragglers.items() if q != p}
            self._replan(job, f"pipeline {p} recovered", "recovered")

    # --- slow stages ----------------------------------------------------------------------------

    def _profile_time(self, job: _Job, stage: int, kind: str, mhz: int) -> float | None:
        """The profile's time of ``kind`` on ``stage`` at ``mhz`` (None when not profiled)."""
        if job.profile is None:
            return None
        table = job.profile_times.get((stage, kind))
        if table is None:
            entry = job.profile.entries.get((stage, kind))
            if entry is None:
                return None
            table = {int(f): float(t) for f, t in zip(entry.frequencies, entry.times, strict=True)}
            job.profile_times[(stage, kind)] = table
        return table.get(int(mhz))

    def _detect_stages(self, job: _Job, rank: RankInfo, instructions: Any) -> None:
        """Per-stage slowdown factors of one reported iteration (see :mod:`stragglers`)."""
        dep = job.deployment
        if dep is None or dep.kind != "plan" or job.frontier is None or job.profile is None:
            return
        per_rank = job.profile.stages == job.schedule.ranks
        ratios: dict[int, list[float]] = {}
        for m in instructions:
            stage = rank.pipeline_rank if per_rank else int(m.stage)
            t = self._profile_time(job, stage, m.instruction, m.frequency_mhz)
            if t is not None and t > 0:
                ratios.setdefault(stage, []).append(float(m.time) / t)
        p = rank.data_rank
        det = job.stage_detector
        for stage, rs in ratios.items():
            factor = statistics.median(rs)
            current = job.stage_flags.get((p, stage))
            event, value = det.observe(p, stage, factor, current)
            if event in ("slow", "changed"):
                job.stage_flags[(p, stage)] = value
            elif event == "recovered":
                job.stage_flags.pop((p, stage), None)
            if event is not None:
                # Decide once every stage has reported this iteration too: a uniformly slow
                # pipeline must not look like one slow stage because its ranks report apart.
                job.stage_pending[p] = max(job.stage_pending.get(p, 0), det.seen[(p, stage)])
        pending = job.stage_pending.get(p)
        if pending is not None and det.caught_up(p, pending):
            del job.stage_pending[p]
            self._slow_stages_changed(job, p)

    def _stage_solve_key(self, job: _Job, p: int) -> str:
        return f"{job.id}:pipeline{p}"

    def _slow_stages_changed(self, job: _Job, p: int) -> None:
        """Re-solve pipeline ``p``'s frontier for its slow stages, or drop it when none is left.

        When every stage of the pipeline is slow, the pipeline is simply slower (its frontier
        scales in time); the iteration-time detector handles that without a re-solve.
        """
        assert job.profile is not None
        factors = {s: f for (q, s), f in job.stage_flags.items() if q == p}
        if not factors or len(factors) >= job.profile.stages:
            if p in job.slow_stages:
                why = (
                    f"pipeline {p}: its stages are back to their profiled speed"
                    if not factors
                    else f"pipeline {p}: every stage is slow; handled as a slow pipeline"
                )
                self._drop_slow_stages(job, p)
                self._replan(job, why, "slow_stage_recovered")
            return
        old = job.slow_stages.get(p)
        if old is not None and old.factors == factors:
            return
        key = self._stage_solve_key(job, p)
        self.solver.cancel(key, "superseded by newer slow-stage factors")
        state = _SlowStages(factors, generation=(old.generation + 1) if old else 1)
        if old is not None and old.status == "ready":
            # Keep running the previous re-solved plan until the new one is ready.
            state.frontier, state.status = old.frontier, "ready"
            state.solve_seconds, state.wall_seconds = old.solve_seconds, old.wall_seconds
        job.slow_stages[p] = state
        profile = job.profile
        for stage, f in factors.items():
            profile = profile.scaled(stage, time_factor=f)
        log.info(
            "job %s: pipeline %d has slow stage(s) %s; re-solving its frontier",
            job.id,
            p,
            state.describe(),
        )
        t0 = time.perf_counter()
        generation = state.generation

        def on_done(doc: str, seconds: float) -> None:
            cur = job.slow_stages.get(p)
            if job.id not in self._jobs or cur is None or cur.generation != generation:
                return
            try:
                cur.frontier = Frontier.from_json(json.loads(doc))
            except Exception as e:  # noqa: BLE001
                on_failed(f"the solver returned an unreadable frontier: {e}")
                return
            cur.status, cur.steps, cur.error = "ready", None, None
            cur.solve_seconds, cur.wall_seconds = seconds, time.perf_counter() - t0
            self.metrics.stage_resolve_seconds.observe(seconds)
            job.detector.reset(p)
            job.stragglers = {q: s for q, s in job.stragglers.items() if q != p}
            self._replan(
                job,
                f"pipeline {p} slow stage(s) {cur.describe()}: frontier re-solved in "
                f"{seconds:.2f} s; its fastest plan takes {float(cur.frontier.times[0]):.4g} s",
                "slow_stage",
            )

        def on_failed(reason: str) -> None:
            cur = job.slow_stages.get(p)
            if cur is None or cur.generation != generation:
                return
            if cur.frontier is None:
                cur.status = "failed"
            cur.error = reason
            log.warning("job %s: re-solving pipeline %d failed: %s", job.id, p, reason)

        def launch() -> None:
            self.solver.start(
                key,
                profile.to_csv(),
                job.schedule.to_json(),
                job.spec.blocking_power,
                SolveEvents(lambda pid: None, lambda f: None, on_done, on_failed),
            )

        if not self.solver.is_active(key):
            launch()
            return

        async def retry() -> None:
            # The superseded solve holds the key until its worker is reaped.
            while self.solver.is_active(key):
                await asyncio.sleep(0.05)
            cur = job.slow_stages.get(p)
            if job.id in self._jobs and cur is not None and cur.generation == generation:
                launch()

        task = asyncio.get_running_loop().create_task(retry())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _drop_slow_stages(self, job: _Job, p: int) -> None:
        self.solver.cancel(self._stage_solve_key(job, p), "the slow stage recovered")
        job.slow_stages.pop(p, None)
        for key in [k for k in job.stage_flags if k[0] == p]:
            del job.stage_flags[key]
        job.stragglers = {
            q: s for q, s in job.stragglers.items() if q != p or s.source != "slow stage"
        }

    # --- ranks (gRPC) ----------------------------------------------------------------------------

    def register_rank(self, req: pb.RegisterRankRequest) -> pb.RegisterRankResponse:
        job = self._job(req.job_id)
        spec = job.spec
        checks = (
            ("global_rank", req.global_rank, spec.world_size),
            ("pipeline_rank", req.pipeline_rank, spec.stages),
            ("data_rank", req.data_rank, spec.data_parallel),
            ("tensor_rank", req.tensor_rank, spec.tensor_parallel),
        )
        for name, value, n in checks:
            if not (0 <= value < n):
                raise BadRequest(
                    f"must be between 0 and {n - 1} for this job, got {value}", field=name
                )
        clocks = tuple(sorted({int(c) for c in req.supported_clocks_mhz}, reverse=True))
        if any(c <= 0 or c > 100_000 for c in clocks) or len(clocks) > 1024:
            raise BadRequest(
                "clocks must be 1..1024 positive MHz values", field="supported_clocks_mhz"
            )
        if len(req.gpu_name) > 256 or len(req.hostname) > 256:
            raise BadRequest(
                "at most 256 characters",
                field="gpu_name" if len(req.gpu_name) > 256 else "hostname",
            )
        existing = job.ranks.get(req.global_rank)
        slot = (req.pipeline_rank, req.data_rank, req.tensor_rank)
        if (
            existing is not None
            and (existing.pipeline_rank, existing.data_rank, existing.tensor_rank) != slot
        ):
            raise Conflict(
                f"global_rank {req.global_rank} is registered as pipeline_rank={existing.pipeline_rank} "
                f"data_rank={existing.data_rank} tensor_rank={existing.tensor_rank}",
                field="global_rank",
            )
        for r in job.ranks.values():
            if (
                r.global_rank != req.global_rank
                and (r.pipeline_rank, r.data_rank, r.tensor_rank) == slot
            ):
                raise Conflict(
                    f"pipeline_rank/data_rank/tensor_rank {slot} is taken by global_rank {r.global_rank}",
                    field="global_rank",
                )
        rank = RankInfo(
            job_id=job.id,
            rank_id=existing.rank_id
            if existing
            else f"{job.id}-{req.global_rank}-{secrets.token_hex(4)}",
            global_rank=req.global_rank,
            pipeline_rank=req.pipeline_rank,
            data_rank=req.data_rank,
            tensor_rank=req.tensor_rank,
            gpu_name=req.gpu_name,
            supported_clocks=clocks,
            hostname=req.hostname,
        )
        if job.profile is not None and clocks:
            try:
                self._check_clocks(job, job.profile, [rank])
            except BadRequest as e:
                raise BadRequest(e.detail, field="supported_clocks_mhz") from None
        if rank != existing:
            self.store.put_rank(rank)
        job.ranks[rank.global_rank] = rank
        job.by_id[rank.rank_id] = rank
        job.history.setdefault(rank.rank_id, deque(maxlen=32))
        max_clock = (
            clocks[0] if clocks else (job.profile.frequencies[0] if job.profile is not None else 0)
        )
        return pb.RegisterRankResponse(
            rank_id=rank.rank_id,
            plan_version=job.version if job.deployment is not None else 0,
            stages=spec.stages,
            microbatches=spec.microbatches,
            max_clock_mhz=max_clock,
        )

    def subscribe(self, job_id: str, rank_id: str) -> tuple[Subscriber, pb.PlanUpdate | None]:
        job = self._job(job_id)
        rank = job.by_id.get(rank_id)
        if rank is None:
            raise Conflict(
                f"rank {rank_id!r} is not registered in job {job_id}; call RegisterRank first",
                field="rank_id",
            )
        sub = self.hub.subscribe(rank)
        return sub, self._message(job, rank)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.hub.unsubscribe(sub)

    def record_reports(self, reports: list[pb.IterationReport]) -> int:
        """Validate and store a batch of iteration reports (all or nothing); returns how many."""
        if not reports:
            return 0
        rows_by_job: dict[str, list[tuple[str, int, float, float, int]]] = {}
        checked: list[tuple[_Job, RankInfo, pb.IterationReport]] = []
        for i, rep in enumerate(reports):
            job = self._job(rep.job_id)
            rank = job.by_id.get(rep.rank_id)
            if rank is None:
                raise Conflict(
                    f"report {i}: rank {rep.rank_id!r} is not registered in job {rep.job_id}",
                    field="rank_id",
                )
            if not (math.isfinite(rep.iteration_time) and rep.iteration_time > 0):
                raise BadRequest(
                    f"report {i}: must be a positive number of seconds, got {rep.iteration_time!r}",
                    field="iteration_time",
                )
            if not (math.isfinite(rep.energy) and rep.energy >= 0):
                raise BadRequest(
                    f"report {i}: must be a finite number of joules >= 0, got {rep.energy!r}",
                    field="energy",
                )
            if rep.iteration < 0:
                raise BadRequest(
                    f"report {i}: must be >= 0, got {rep.iteration}", field="iteration"
                )
            if len(rep.instructions) > self.limits.max_report_instructions:
                raise BadRequest(
                    f"report {i}: at most {self.limits.max_report_instructions} measurements",
                    field="instructions",
                )
            for j, m in enumerate(rep.instructions):
                where = f"report {i} instructions[{j}]"
                if m.instruction not in INSTRUCTION_KINDS:
                    raise BadRequest(
                        f"{where}: unknown instruction {m.instruction!r}",
                        field="instructions.instruction",
                    )
                if not (math.isfinite(m.time) and m.time > 0):
                    raise BadRequest(
                        f"{where}: time must be a positive number, got {m.time!r}",
                        field="instructions.time",
                    )
                if not (math.isfinite(m.energy) and m.energy >= 0):
                    raise BadRequest(
                        f"{where}: energy must be finite and >= 0, got {m.energy!r}",
                        field="instructions.energy",
                    )
                if not (0 <= m.stage < job.schedule.stages) or not (
                    0 <= m.microbatch < job.spec.microbatches
                ):
                    raise BadRequest(
                        f"{where}: stage or microbatch out of range", field="instructions.stage"
                    )
                if m.frequency_mhz < 0:
                    raise BadRequest(
                        f"{where}: frequency must be >= 0", field="instructions.frequency_mhz"
                    )
            checked.append((job, rank, rep))
            rows_by_job.setdefault(job.id, []).append(
                (
                    rank.rank_id,
                    int(rep.iteration),
                    float(rep.iteration_time),
                    float(rep.energy),
                    int(rep.plan_version),
                )
            )
        for job_id, rows in rows_by_job.items():
            self.store.add_iterations(job_id, rows, self.limits.history_per_rank)
        touched: set[str] = set()
        for job, rank, rep in checked:
            job.history.setdefault(rank.rank_id, deque(maxlen=32)).append(
                (
                    int(rep.iteration),
                    float(rep.iteration_time),
                    float(rep.energy),
                    int(rep.plan_version),
                )
            )
            times = job.pipeline_times.setdefault(rank.data_rank, OrderedDict())
            times[int(rep.iteration)] = max(
                times.get(int(rep.iteration), 0.0), float(rep.iteration_time)
            )
            while len(times) > 64:
                times.popitem(last=False)
            if job.profiling is not None and job.profiling.status == "running":
                ms = [
                    Measurement(m.instruction, m.stage, m.frequency_mhz, m.time, m.energy)
                    for m in rep.instructions
                ]
                if ms:
                    job.profiling.record(rank.rank_id, int(rep.plan_version), float(rep.energy), ms)
                    touched.add(job.id)
            else:
                self._detect(
                    job, rank, int(rep.iteration), float(rep.iteration_time), int(rep.plan_version)
                )
                if rep.instructions:
                    self._detect_stages(job, rank, rep.instructions)
        for job_id in touched:
            if job_id in self._jobs:
                self._profiling_tick(self._jobs[job_id])
        self.metrics.reports.inc(len(checked))
        return len(checked)

    # --- online profiling ------------------------------------------------------------------------

    def start_profiling(
        self,
        job_id: str,
        frequencies: list[int] | None,
        warmup: int,
        iterations: int,
        stop_after_rises: int,
    ) -> dict[str, Any]:
        job = self._job(job_id)
        if self.solver.is_active(job_id):
            raise Conflict("a frontier computation is running; cancel it first", field="profiling")
        if job.profiling is not None and job.profiling.status in ("running", "solving"):
            raise Conflict("online profiling is already running for this job", field="profiling")
        ranks = list(job.ranks.values())
        if frequencies is None:
            if not ranks or any(not r.supported_clocks for r in ranks):
                raise Conflict(
                    "no registered rank reported its supported clocks; give frequencies",
                    field="frequencies",
                )
            common = set(ranks[0].supported_clocks)
            for r in ranks[1:]:
                common &= set(r.supported_clocks)
            frequencies = sorted(common, reverse=True)
            if not frequencies:
                raise Conflict(
                    "the registered ranks share no supported clock; give frequencies",
                    field="frequencies",
                )
        else:
            if (
                not frequencies
                or len(frequencies) > 255
                or len(set(frequencies)) != len(frequencies)
            ):
                raise BadRequest("must be 1..255 distinct frequencies", field="frequencies")
            if any(f <= 0 for f in frequencies):
                raise BadRequest("frequencies must be positive MHz values", field="frequencies")
            for r in ranks:
                bad = (
                    sorted(set(frequencies) - set(r.supported_clocks)) if r.supported_clocks else []
                )
                if bad:
                    raise BadRequest(
                        f"rank {r.global_rank} does not support {bad[:5]} MHz", field="frequencies"
                    )
            frequencies = sorted(frequencies, reverse=True)
        for name, v, lo in (
            ("warmup_iterations", warmup, 0),
            ("iterations_per_frequency", iterations, 1),
            ("stop_after_rises", stop_after_rises, 1),
        ):
            if not (lo <= v <= 1000):
                raise BadRequest(f"must be between {lo} and 1000, got {v}", field=name)
        session = ProfilingSession(frequencies, warmup, iterations, stop_after_rises)
        job.profiling = session
        self._profiling_step(job)
        return self.profiling_status(job_id)

    def _profiling_step(self, job: _Job) -> None:
        s = job.profiling
        assert s is not None
        s.step_version = job.version + 1
        self.store.put_profiling(job.id, s.to_json())
        self._publish(
            job,
            Deployment(
                version=job.version + 1,
                kind="profiling",
                reason=f"online profiling: {s.frequency} MHz ({s.step + 1} of at most {len(s.frequencies)})",
                profiling={
                    "frequency": s.frequency,
                    "warmup_iterations": s.warmup_iterations,
                    "iterations": s.iterations,
                },
                deployed_at=time.time(),
            ),
            "profiling",
        )

    def _profiling_tick(self, job: _Job) -> None:
        s = job.profiling
        if s is None or not s.step_complete(set(job.by_id), job.schedule.stages):
            return
        if not s.advance():
            self._profiling_step(job)
            return
        try:
            profile = parse_profile_csv(s.profile_csv())
            EnergyProblem.build(profile, job.schedule, job.spec.blocking_power)
        except ProfileError as e:
            s.status, s.error = "failed", f"the measured profile is unusable: {e}"
            self.store.put_profiling(job.id, s.to_json())
            self._after_profiling(job)
            return
        self._store_profile(job, profile, "online profiling")
        s.status = "solving"
        self.store.put_profiling(job.id, s.to_json())
        self._after_profiling(job)
        self._launch_solve(job)

    def _after_profiling(self, job: _Job) -> None:
        """Leave the profiling plan: the previous frontier's plan, or max clocks meanwhile."""
        s = job.profiling
        if job.frontier is not None and (s is None or s.status != "solving"):
            self._deploy_decision(job, "profiling ended", force=True)
            return
        top = s.frequencies[0] if s is not None else 0
        self._publish(
            job,
            Deployment(
                version=job.version + 1,
                kind="max_clock",
                reason="online profiling finished; computing the frontier (max clocks meanwhile)"
                if s is not None and s.status == "solving"
                else "profiling ended: max clocks",
                max_clock=top,
                deployed_at=time.time(),
            ),
            "profiling",
        )

    def abort_profiling(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        if job.profiling is None or job.profiling.status != "running":
            raise Conflict("no online profiling is running for this job", field="profiling")
        job.profiling.status, job.profiling.error = "aborted", "aborted by request"
        self.store.put_profiling(job.id, job.profiling.to_json())
        self._after_profiling(job)
        return self.profiling_status(job_id)

    def profiling_status(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        if job.profiling is None:
            raise NotFound("online profiling was never started for this job", field="profiling")
        out = job.profiling.progress()
        out["ranks"] = len(job.by_id)
        return out

    # --- status ----------------------------------------------------------------------------------

    def status(self, job_id: str) -> dict[str, Any]:
        job = self._job(job_id)
        connected = self.hub.connected(job_id)
        ranks = []
        for r in sorted(job.ranks.values(), key=lambda r: r.global_rank):
            hist = job.history.get(r.rank_id)
            last = hist[-1] if hist else None
            ranks.append(
                {
                    **r.to_json(),
                    "connected": r.rank_id in connected,
                    "last_iteration": last[0] if last else None,
                    "last_iteration_time": last[1] if last else None,
                    "last_plan_version": last[3] if last else None,
                }
            )
        pipelines = []
        for p in range(job.spec.data_parallel):
            times = job.pipeline_times.get(p)
            recent = list(times.items())[-16:] if times else []
            s = job.stragglers.get(p)
            ss = job.slow_stages.get(p)
            pipelines.append(
                {
                    "pipeline": p,
                    "recent_iterations": [{"iteration": i, "time": t} for i, t in recent],
                    "straggler": None if s is None else {"time": s.time, "source": s.source},
                    "slow_stages": None if ss is None else ss.to_json(),
                }
            )
            if not recent:
                pipelines[-1]["recent_iterations"] = []
        prof = job.profiling.progress() if job.profiling is not None else None
        return {
            "job_id": job.id,
            "state": self._state(job),
            "expected_ranks": job.spec.world_size,
            "registered_ranks": len(job.ranks),
            "connected_ranks": len(connected),
            "plan": self.deployment_view(job_id),
            "frontier": {
                k: v
                for k, v in self.frontier_status(job_id, points=False).items()
                if k != "worker_pid"
            },
            "pipelines": pipelines,
            "ranks": ranks if len(ranks) <= 4096 else ranks[:4096],
            "straggler_detection": job.detector.settings.to_json(),
            "iteration_overhead": job.detector.calibration(),
            "recent_replans": list(job.replans),
            "profiling": prof,
        }

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "jobs": len(self._jobs),
            "uptime_seconds": time.time() - self._started,
        }
