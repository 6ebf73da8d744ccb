"""Deciding what every pipeline runs and publishing it (``service/deployment.py``).

A real service and SQLite file, the job's frontier really solved (two stages, four clocks of
the A100 profile) and set as the solver would: each deployment the next version, stored before
it is pushed; a pinned pipeline; each rank's message cut from its pipeline's plan; refusals by
their field. Plans pushed to real ranks over gRPC are ``tests/server/grpc/test_service.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus.frontier import Frontier
from perseus.profiles import Profile
from perseus_server.config import Limits
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.errors import BadRequest, Conflict
from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.deployment import require_frontier
from perseus_server.service.state import Job

from .conftest import BLOCKING


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "deploy.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def _job(service: PerseusService, profile: Profile, frontier: Frontier | None) -> Job:
    spec = JobSpec(stages=2, microbatches=4, data_parallel=2, blocking_power=BLOCKING)
    job = service.jobs.get(str(service.create_job(spec)["id"]))
    job.profile.set(profile, 1, "upload")
    if frontier is not None:
        job.frontier.set(frontier)  # as a finished solve does
    return job


def _rank(job: Job, g: int) -> RankInfo:
    return RankInfo(job.id, f"{job.id}-{g}", g, g % 2, g // 2, 0, "NVIDIA A40", (), "h")


def test_a_job_without_a_frontier_has_nothing_to_deploy(
    service: PerseusService, profile: Profile
) -> None:
    job = _job(service, profile, None)
    with pytest.raises(Conflict, match="no frontier yet") as e:
        require_frontier(job)
    assert e.value.field == "frontier"
    with pytest.raises(Conflict):
        service.deployer.deploy(job.id, PlanPolicy(), None)
    assert service.deployer.message(job, _rank(job, 0)) is None  # nothing deployed: nothing sent


def test_each_deployment_is_the_next_version_stored_before_it_is_pushed(
    service: PerseusService, profile: Profile, frontier: Frontier
) -> None:
    job = _job(service, profile, frontier)
    last = len(frontier) - 1
    service.deployer.deploy(job.id, PlanPolicy("index", float(last)), None)
    dep = job.deployment.current
    assert dep is not None and dep.version == 1 and dep.indices == (last, last)
    stored = service.store.deployment(job.id)
    assert stored is not None and stored[0] == 1
    assert stored[1]["deployment"]["indices"] == [last, last]
    service.deployer.deploy(job.id, PlanPolicy("index", 0.0), [1])  # pin pipeline 1 only
    dep = job.deployment.current
    assert dep is not None and dep.version == 2 and dep.indices == (last, 0)
    assert not service.deployer.decide(job, "nothing changed")  # the same plan: no new version
    assert service.deployer.decide(job, "forced", force=True)
    assert job.deployment.version == 3


def test_a_ranks_message_is_its_pipelines_plan_for_its_stage(
    service: PerseusService, profile: Profile, frontier: Frontier
) -> None:
    job = _job(service, profile, frontier)
    last = len(frontier) - 1
    service.deployer.deploy(job.id, PlanPolicy("index", 0.0), None)
    service.deployer.deploy(job.id, PlanPolicy("index", float(last)), [1])
    fast = service.deployer.message(job, _rank(job, 1))  # pipeline 0, stage 1
    slow = service.deployer.message(job, _rank(job, 3))  # pipeline 1, stage 1
    assert fast is not None and slow is not None
    assert fast.version == slow.version == 2
    assert fast.expected_iteration_time == pytest.approx(float(frontier.times[0]))
    assert slow.expected_iteration_time == pytest.approx(float(frontier.times[last]))
    assert {s.stage for s in fast.steps} == {1}
    assert max(s.frequency_mhz for s in fast.steps) >= max(s.frequency_mhz for s in slow.steps)
    assert service.deployer.message(job, _rank(job, 1)) is fast  # cached per version


def test_bad_pins_and_unreachable_policies_are_refused_by_their_field(
    service: PerseusService, profile: Profile, frontier: Frontier
) -> None:
    job = _job(service, profile, frontier)
    for pipelines in ([], [2], [-1]):
        with pytest.raises(BadRequest, match="pipelines must be a non-empty list") as e:
            service.deployer.deploy(job.id, PlanPolicy(), pipelines)
        assert e.value.field == "pipelines"
    with pytest.raises(BadRequest) as e:
        service.deployer.deploy(job.id, PlanPolicy("deadline", 1e-9), None)
    assert e.value.field == "deadline"
    assert job.deployment.current is None and service.store.deployment(job.id) is None
