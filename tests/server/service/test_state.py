"""A job's in-memory state (``service/state.py``).

The stored form of a deployment, the profile's time lookup, where a job stands, the job table,
a pipeline's ranks counted, and a slow stage's words. The state driven by a real server is
every other file of this folder.
"""

from __future__ import annotations

import json

import pytest

from perseus.profiles import Profile
from perseus_server.domain.errors import NotFound
from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import FrontierRow, JobRow
from perseus_server.domain.states import (
    DeploymentKind,
    JobState,
    SlowStageStatus,
    SolveStatus,
)
from perseus_server.service.state import (
    Deployment,
    DeploymentState,
    Job,
    JobTable,
    RankState,
    SlowStages,
)


def _job(job_id: str = "j", pipelines: int = 1) -> Job:
    spec = JobSpec(stages=2, microbatches=4, data_parallel=pipelines)
    return Job(row=JobRow(job_id, 0.0, spec), schedule=spec.build_schedule())


def test_a_deployment_round_trips_through_its_stored_json() -> None:
    dep = Deployment(
        7, DeploymentKind.PLAN, "default", (3, 1), ("a", "b"), None, 1410, 12.5, own=(1,)
    )
    doc = json.loads(json.dumps(dep.to_json()))
    assert Deployment.from_json(7, doc) == dep
    old = Deployment.from_json(2, {"kind": "max_clock", "reason": "no plan yet"})
    assert old == Deployment(2, DeploymentKind.MAX_CLOCK, "no plan yet")
    state = DeploymentState(current=old)
    assert state.plan is None
    state.current = dep
    assert state.plan is dep


def test_the_profile_lookup_answers_profiled_clocks_only(a100: Profile) -> None:
    job = _job()
    assert job.profile.time_of(0, "forward", 1410) is None
    job.profile.set(a100, 3, "upload")
    entry = a100.entries[(0, "forward")]
    mhz, time = int(entry.frequencies[0]), float(entry.times[0])
    assert job.profile.time_of(0, "forward", mhz) == time
    assert job.profile.time_of(0, "forward", 1) is None  # a clock not profiled
    assert job.profile.time_of(99, "forward", mhz) is None  # a stage not profiled
    assert (job.profile.revision, job.profile.source) == (3, "upload")


def test_a_jobs_state_follows_its_parts(a100: Profile) -> None:
    job = _job()
    assert job.state() is JobState.CREATED
    job.profile.set(a100, 1, "upload")
    assert job.state() is JobState.PROFILED
    for status, state in [
        (SolveStatus.QUEUED, JobState.SOLVING),
        (SolveStatus.PARTIAL, JobState.SOLVING),
        (SolveStatus.FAILED, JobState.FAILED),
        (SolveStatus.DONE, JobState.PROFILED),  # done, but no frontier loaded
    ]:
        job.frontier.row = FrontierRow(status)
        assert job.state() is state, status
    assert job.state() == "profiled" and job.spec.data_parallel == 1 and job.id == "j"


def test_the_job_table_keeps_jobs_in_order_and_names_an_unknown_id() -> None:
    table = JobTable()
    for job_id in ("b", "a", "c"):
        table.add(_job(job_id))
    assert table.ids() == ["b", "a", "c"] and len(table) == 3 and "a" in table
    assert table.get("a").id == "a" and table.find("zz") is None
    with pytest.raises(NotFound, match="no job with id 'zz'") as e:
        table.get("zz")
    assert e.value.field == "job_id"
    for job in table:  # removing while iterating is safe
        table.remove(job.id)
    assert len(table) == 0


def test_a_pipeline_is_complete_once_each_slot_registered_once() -> None:
    ranks = RankState()
    for g, d in [(0, 0), (1, 0), (2, 1), (2, 1)]:  # rank 2 registers twice
        ranks.add(RankInfo("j", f"r{g}", g, g % 2, d, 0, "NVIDIA A40", (), "h"))
    assert ranks.per_pipeline == {0: 2, 1: 1}
    assert ranks.complete(2) == 1 and ranks.complete(1) == 2
    assert set(ranks.by_id) == {"r0", "r1", "r2"} and set(ranks.history) == set(ranks.by_id)


def test_slow_stages_in_words_and_as_shown() -> None:
    slow = SlowStages({1: 1.5, 0: 1.25}, links={(0, "forward"): 0.0042})
    assert slow.describe() == "stage 0 x1.25, stage 1 x1.5, link 0 forward 4.2 ms"
    assert not slow.ready  # solving, no frontier
    doc = slow.to_json()
    assert doc["factors"] == {"1": 1.5, "0": 1.25} and doc["status"] == SlowStageStatus.SOLVING
    assert doc["time"] is None
    assert doc["links"] == [{"boundary": 0, "direction": "forward", "time": 0.0042}]
