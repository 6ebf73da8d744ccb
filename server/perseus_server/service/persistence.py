"""Jobs to and from the store: the state rebuilt at start, and the deployment document.

Rebuilding the in-memory state at start, and the deployment document (what is deployed, the policy,
stragglers, detector settings, re-solved slow stages) written whenever it changes.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import Any

from perseus.frontier import Frontier
from perseus.profiles import parse_profile_csv
from perseus_server.decisions.detectors import DetectorSettings, make_detectors
from perseus_server.decisions.planner import PlanPolicy, Straggler
from perseus_server.decisions.profiling_scan import ProfilingSession
from perseus_server.domain.states import (
    ProfilingStatus,
    SlowStageStatus,
    SolveStatus,
    StragglerSource,
)
from perseus_server.domain.store import Store
from perseus_server.service.state import Deployment, Job, JobTable, SlowStages

__all__ = ["deployment_doc", "load_jobs", "persist_deployment"]

log = logging.getLogger("perseus.server")


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
        # The links' first-window baselines (a slow link recovers against it after a restart).
        "link_baselines": [[p, b, d, t] for (p, b, d), t in slow.links.baselines.items()],
    }
    if doc["deployment"] is None:
        del doc["deployment"]
    return doc


def persist_deployment(store: Store, job: Job) -> None:
    """Store the job's deployment document under its current version."""
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
    settings = DetectorSettings.from_json(doc.get("detector", {}))
    slow.detector, slow.stage_detector = make_detectors(settings)
    for key, ss in doc.get("slow_stages", {}).items():
        state = SlowStages(
            {int(k): float(v) for k, v in ss["factors"].items()},
            status=SlowStageStatus.READY,
            frontier=Frontier.from_json(ss["frontier"]),
            solve_seconds=float(ss.get("solve_seconds", 0.0)),
            wall_seconds=float(ss.get("wall_seconds", 0.0)),
            links={
                (int(x["boundary"]), str(x["direction"])): float(x["time"])
                for x in ss.get("links", [])  # slow links (absent before they were measured)
            },
        )
        slow.slow_stages[int(key)] = state
        for st, f in state.factors.items():
            slow.stage_flags[(int(key), st)] = f
        for (b, d), t in state.links.items():
            slow.links.flags[(int(key), b, d)] = t
    for p, b, d, t in doc.get("link_baselines", []):
        slow.links.baselines[(int(p), int(b), str(d))] = float(t)


def _unreadable(what: str, e: Exception) -> str:
    return f"the stored {what} of this job cannot be read ({type(e).__name__}: {str(e)[:200]})"


def _load_job(store: Store, job: Job) -> str | None:
    """Fill ``job`` from the store piece by piece; returns why a piece could not be read, or None.

    The pieces after a bad frontier, which refer to it, are left out too.
    """
    row = job.row
    try:
        prof = store.profile(row.id)
        if prof is not None:
            job.profile.set(parse_profile_csv(prof[0]), prof[1], prof[2])
    except Exception as e:  # noqa: BLE001 - any unreadable row: the job fails, the server starts
        return _unreadable("profile", e)
    try:
        job.frontier.row = store.frontier(row.id)
        if job.frontier.row.doc:
            job.frontier.current = Frontier.from_json(json.loads(job.frontier.row.doc))
    except Exception as e:  # noqa: BLE001
        job.frontier.current = None
        return _unreadable("frontier", e)
    try:
        dep = store.deployment(row.id)
        if dep is not None:
            _restore_deployment(job, *dep)
            _check_deployment(job)
    except Exception as e:  # noqa: BLE001
        job.deployment = type(job.deployment)()
        job.stragglers = type(job.stragglers)()
        return _unreadable("deployment", e)
    try:
        for r in store.ranks(row.id):
            job.ranks.add(r)
            job.ranks.history[r.rank_id] = deque(store.iterations(r.rank_id, 32), maxlen=32)
        job.ranks.last_sequence = store.report_sequences(row.id)
        prof_doc = store.profiling(row.id)
        if prof_doc is not None:
            job.profiling = ProfilingSession.from_json(prof_doc)
    except Exception as e:  # noqa: BLE001
        job.profiling = None
        return _unreadable("ranks or profiling state", e)
    return None


def _check_deployment(job: Job) -> None:
    """A plan deployment must point into the frontier it was made from."""
    dep, frontier = job.deployment.plan, job.frontier.current
    if dep is None:
        return
    if frontier is None or any(not 0 <= i < len(frontier) for i in dep.indices):
        raise ValueError("the deployed plan points past the stored frontier")


def load_jobs(store: Store, jobs: JobTable, *, resume: bool = False) -> list[str]:
    """Rebuild every job from the store; solves cut short by a restart are marked failed.

    A job whose stored state cannot be read is marked failed with the reason (its frontier
    row says why) and the server starts anyway; one whose description itself is unreadable
    is left out with an error in the log. With ``resume`` (a new leader taking over from
    one that died), solves cut short are left as stored and their jobs' ids returned, for
    the caller to start again; otherwise none are returned.
    """
    interrupted = store.interrupted_solves()
    for job_id in () if resume else interrupted:
        try:
            frow = store.frontier(job_id)
        except Exception:  # noqa: BLE001 - handled per job below
            continue
        frow.status, frow.error, frow.finished = (
            SolveStatus.FAILED,
            "interrupted: the server restarted during the computation",
            time.time(),
        )
        store.put_frontier(job_id, frow)

    def skipped(job_id: str, e: Exception) -> None:
        log.error("job %s: %s; the job is not served", job_id, _unreadable("description", e))

    for row in store.jobs(on_error=skipped):
        try:
            schedule = row.spec.build_schedule()
        except Exception as e:  # noqa: BLE001
            skipped(row.id, e)
            continue
        job = Job(row=row, schedule=schedule)
        reason = _load_job(store, job)
        if reason is not None:
            log.error("job %s: %s; marked failed", row.id, reason)
            frow = job.frontier.row
            frow.status, frow.error, frow.finished = SolveStatus.FAILED, reason, time.time()
            frow.doc = frow.doc if job.frontier.current is not None else None
            store.put_frontier(row.id, frow)
        jobs.add(job)
    resumed = [
        j for j in interrupted if resume and j in jobs and jobs.get(j).frontier.row.status.active
    ]
    for job in jobs:
        if job.id in resumed:
            continue  # its solve is started again: its profiling goes on with it
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
    return resumed
