"""Jobs to and from the store: rebuilding the in-memory state at start, and the deployment
document (what is deployed, the policy, stragglers, detector settings, re-solved slow stages)
written whenever it changes."""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any

from perseus.frontier import Frontier
from perseus.profiles import parse_profile_csv
from perseus_server.planner import PlanPolicy, Straggler
from perseus_server.profiling import ProfilingSession
from perseus_server.service.state import Deployment, Job, JobTable, SlowStages
from perseus_server.states import ProfilingStatus, SlowStageStatus, SolveStatus, StragglerSource
from perseus_server.store import Store
from perseus_server.stragglers import DetectorSettings, StageDetector, StragglerDetector

__all__ = ["deployment_doc", "load_jobs", "persist_deployment"]


def deployment_doc(job: Job) -> dict[str, Any]:
    """The stored form of what ``job`` runs and why (see :func:`load_jobs` for the way back)."""
    dep, slow = job.deployment, job.stragglers
    doc: dict[str, Any] = {
        "deployment": dep.current.to_json() if dep.current is not None else None,
        "policy": dep.policy.to_json(),
        "overrides": {str(k): v for k, v in dep.overrides.items()},
        "stragglers": [
            {"pipeline": s.pipeline, "time": s.time, "source": s.source, "detail": s.detail}
            if s.detail
            else {"pipeline": s.pipeline, "time": s.time, "source": s.source}
            for s in slow.stragglers.values()
        ],
        "detector": slow.detector.settings.to_json(),
        "slow_stages": {
            str(p): {**st.to_json(), "frontier": st.frontier.to_json(compact=True)}
            for p, st in slow.slow_stages.items()
            if st.ready and st.frontier is not None
        },
    }
    if doc["deployment"] is None:
        del doc["deployment"]
    return doc


def persist_deployment(store: Store, job: Job) -> None:
    store.put_deployment(job.id, job.deployment.version, deployment_doc(job))


def _restore_deployment(job: Job, version: int, doc: dict[str, Any]) -> None:
    dep, slow = job.deployment, job.stragglers
    dep.version = version
    dep.current = Deployment.from_json(version, doc["deployment"]) if "deployment" in doc else None
    dep.policy = PlanPolicy.from_json(doc.get("policy"))
    dep.overrides = {int(k): int(v) for k, v in doc.get("overrides", {}).items()}
    slow.stragglers = {
        int(s["pipeline"]): Straggler(
            int(s["pipeline"]),
            float(s["time"]),
            StragglerSource(s["source"]),
            str(s.get("detail", "")),
        )
        for s in doc.get("stragglers", [])
    }
    settings = DetectorSettings(**doc.get("detector", {}))
    slow.detector = StragglerDetector(settings)
    slow.stage_detector = StageDetector(settings)
    for key, ss in doc.get("slow_stages", {}).items():
        state = SlowStages(
            {int(k): float(v) for k, v in ss["factors"].items()},
            status=SlowStageStatus.READY,
            frontier=Frontier.from_json(ss["frontier"]),
            solve_seconds=float(ss.get("solve_seconds", 0.0)),
            wall_seconds=float(ss.get("wall_seconds", 0.0)),
        )
        slow.slow_stages[int(key)] = state
        for st, f in state.factors.items():
            slow.stage_flags[(int(key), st)] = f


def load_jobs(store: Store, jobs: JobTable) -> None:
    """Rebuild every job from the store; solves cut short by a restart are marked failed."""
    for job_id in store.interrupted_solves():
        frow = store.frontier(job_id)
        frow.status, frow.error, frow.finished = (
            SolveStatus.FAILED,
            "interrupted: the server restarted during the computation",
            time.time(),
        )
        store.put_frontier(job_id, frow)
    for row in store.jobs():
        job = Job(row=row, schedule=row.spec.build_schedule())
        prof = store.profile(row.id)
        if prof is not None:
            job.profile.set(parse_profile_csv(prof[0]), prof[1], prof[2])
        job.frontier.row = store.frontier(row.id)
        if job.frontier.row.doc:
            job.frontier.current = Frontier.from_json(json.loads(job.frontier.row.doc))
        dep = store.deployment(row.id)
        if dep is not None:
            _restore_deployment(job, *dep)
        for r in store.ranks(row.id):
            job.ranks.by_global[r.global_rank] = r
            job.ranks.by_id[r.rank_id] = r
            job.ranks.history[r.rank_id] = deque(store.iterations(r.rank_id, 32), maxlen=32)
        prof_doc = store.profiling(row.id)
        if prof_doc is not None:
            job.profiling = ProfilingSession.from_json(prof_doc)
        jobs.add(job)
    for job in jobs:
        if (
            job.profiling is not None
            and job.profiling.status is ProfilingStatus.SOLVING
            and job.frontier.row.status is not SolveStatus.DONE
        ):
            job.profiling.status = ProfilingStatus.FAILED
            job.profiling.error = (
                "interrupted: the server restarted while solving the measured profile"
            )
            store.put_profiling(job.id, job.profiling.to_json())
