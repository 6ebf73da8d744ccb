"""Jobs to and from the store (``service/persistence.py``), on a real SQLite file.

The deployment document written and read back, solves a restart cut short, and a job whose
stored state cannot be read: failed with why, the others loaded. A real server restarted is
``tests/server/service/test_lifecycle_cluster.py`` and ``runtime/test_faults_crashes.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_server.decisions.planner import PlanPolicy, Straggler
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import FrontierRow
from perseus_server.domain.states import DeploymentKind, SolveStatus, StragglerSource
from perseus_server.domain.store import Store
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service.persistence import deployment_doc, load_jobs, persist_deployment
from perseus_server.service.state import Deployment, JobTable

SPEC = JobSpec(stages=2, microbatches=4, data_parallel=2)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = SqlStore.open(tmp_path / "store.db")
    yield s
    s.close()


def _loaded(store: Store, resume: bool = False) -> tuple[JobTable, list[str]]:
    jobs = JobTable()
    return jobs, load_jobs(store, jobs, resume=resume)


def test_what_a_job_runs_and_why_is_there_after_a_restart(store: Store) -> None:
    store.add_job("j", SPEC)
    (job,) = _loaded(store)[0]
    job.deployment.version = 4
    job.deployment.current = Deployment(4, DeploymentKind.MAX_CLOCK, "no frontier", max_clock=1740)
    job.deployment.policy = PlanPolicy("index", 2.0)
    job.deployment.overrides = {1: 3}
    job.stragglers.stragglers[1] = Straggler(1, 2.5, StragglerSource.SLOW_STAGE, "stage 0 x1.5")
    job.stragglers.links.baselines[(1, 0, "forward")] = 0.004
    persist_deployment(store, job)

    (again,) = _loaded(store)[0]
    assert again.deployment.version == 4 and again.deployment.current == job.deployment.current
    assert again.deployment.policy == job.deployment.policy
    assert again.deployment.overrides == {1: 3}
    assert again.stragglers.stragglers == job.stragglers.stragglers
    assert again.stragglers.links.baselines == {(1, 0, "forward"): 0.004}
    assert deployment_doc(again) == deployment_doc(job)


def test_a_job_with_nothing_deployed_stores_no_deployment(store: Store) -> None:
    store.add_job("j", SPEC)
    (job,) = _loaded(store)[0]
    assert "deployment" not in deployment_doc(job)
    persist_deployment(store, job)
    (again,) = _loaded(store)[0]
    assert again.deployment.current is None and again.deployment.policy == PlanPolicy()


def test_a_solve_cut_short_fails_or_is_handed_back_to_resume(store: Store) -> None:
    for job_id in ("a", "b"):
        store.add_job(job_id, SPEC)
    store.put_frontier("a", FrontierRow(SolveStatus.RUNNING, 0.5))
    jobs, resumed = _loaded(store, resume=True)  # a new leader: solves go on
    assert resumed == ["a"] and jobs.get("a").frontier.row.status is SolveStatus.RUNNING
    jobs, resumed = _loaded(store)  # a restart: the solve failed, saying why
    row = jobs.get("a").frontier.row
    assert resumed == [] and row.status is SolveStatus.FAILED
    assert row.error is not None and "interrupted" in row.error
    assert store.frontier("a").status is SolveStatus.FAILED  # written back
    assert jobs.get("b").frontier.row.status is SolveStatus.NONE


def test_unreadable_state_fails_its_job_with_why_and_the_others_load(store: Store) -> None:
    for job_id in ("bad-profile", "bad-plan", "fine"):
        store.add_job(job_id, SPEC)
    store.put_profile("bad-profile", "not,a,profile\n1,2,3\n", "upload")
    plan = Deployment(1, DeploymentKind.PLAN, "default", (0, 0))  # but no frontier stored
    store.put_deployment("bad-plan", 1, {"deployment": plan.to_json()})
    jobs, _ = _loaded(store)
    assert jobs.ids() == ["bad-profile", "bad-plan", "fine"]
    for job_id, piece in (("bad-profile", "profile"), ("bad-plan", "deployment")):
        row = jobs.get(job_id).frontier.row
        assert row.status is SolveStatus.FAILED and row.error is not None
        assert row.error.startswith(f"the stored {piece} of this job cannot be read")
        assert store.frontier(job_id).status is SolveStatus.FAILED
    assert jobs.get("bad-plan").deployment.current is None  # not half restored
    assert jobs.get("fine").frontier.row.status is SolveStatus.NONE
