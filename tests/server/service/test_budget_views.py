"""``service/budget_views.py``: what the power budget shows, on a real service and SQLite file.

Without a budget: nothing to read (404 naming ``power_budget``), no gauge, no share. With one over
a solved job that no rank has joined: the job is left out, with why, and shown only to its own
tenant; the totals stay the cluster's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus.frontier import Frontier
from perseus.profiles import Profile
from perseus_server.config import Limits
from perseus_server.domain.errors import NotFound
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.state import Job

from .conftest import BLOCKING


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "views.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def _solved(service: PerseusService, profile: Profile, frontier: Frontier) -> Job:
    spec = JobSpec(stages=2, microbatches=4, data_parallel=2, blocking_power=BLOCKING)
    job = service.jobs.get(str(service.create_job(spec)["id"]))
    job.profile.set(profile, 1, "upload")
    job.frontier.set(frontier)  # as a finished solve does
    return job


def test_without_a_budget_there_is_nothing_to_show(
    service: PerseusService, profile: Profile, frontier: Frontier
) -> None:
    job = _solved(service, profile, frontier)
    budget = service.power_budget
    with pytest.raises(NotFound) as e:
        budget.view()
    assert e.value.field == "power_budget"
    assert budget.gauges() == (None, True, {})
    assert budget.tenant_shares() is None
    assert budget.job_share(job) is None and budget.left_out() == []


def test_a_job_no_rank_has_joined_is_left_out_and_shown_to_its_tenant_only(
    service: PerseusService, profile: Profile, frontier: Frontier
) -> None:
    job = _solved(service, profile, frontier)
    service.set_power_budget(1e6, "throughput", None, "least_power")
    budget = service.power_budget
    (out,) = budget.left_out()
    assert out["job"] == job.id and out["why"]
    everyone = budget.view()
    assert everyone["watts"] == 1e6 and everyone["jobs"] == [] and everyone["left_out"] == [out]
    assert everyone["allocated_watts"] == 0.0 and everyone["feasible"]
    assert budget.view(tenant=job.row.tenant)["left_out"] == [out]
    other = budget.view(tenant="someone-else")
    assert other["left_out"] == [] and other["watts"] == 1e6  # the totals stay the cluster's
    assert budget.gauges() == (1e6, True, {})
    assert budget.job_share(job) is None  # not drawing: no share
