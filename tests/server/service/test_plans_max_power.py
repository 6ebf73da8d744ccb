"""Where the cost policy's ``max_power`` comes from when the request gives none.

The limits the job's ranks registered first, the known-GPU table only when no rank told
(docs/server.md, "in order"). A seeded bug that consulted the table first passed every test, none of
which had a job with both a known GPU model and ranks registering a different limit (issue #32).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_common.gpus import known_gpu_for
from perseus_common.wire.values import RankRegistration
from perseus_server.config import Limits
from perseus_server.decisions.planner import PlanPolicy
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.plans import job_max_power, shape_policy

#: What the ranks' GPUs report: a capped A40 (the table says 300 W).
REGISTERED = (240.0, 260.0)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "cost.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def test_the_ranks_registered_limits_come_before_the_known_gpu_table(
    service: PerseusService,
) -> None:
    a40 = known_gpu_for("NVIDIA A40")
    assert a40 is not None and a40.max_power_limit not in REGISTERED
    job_id = service.create_job(
        JobSpec(stages=2, microbatches=4, gpu_model="A40", blocking_power=70.0)
    )["id"]
    job = service.jobs.get(job_id)
    # Before any rank tells: the job's known GPU model.
    assert job_max_power(job) == (a40.max_power_limit, f"the {a40.name}'s maximum power limit")
    for r, watts in enumerate(REGISTERED):
        service.registration.register(
            RankRegistration(job_id, r, r, 0, gpu_name="NVIDIA A40", max_power_limit_w=watts)
        )
    mean = sum(REGISTERED) / len(REGISTERED)
    assert job_max_power(job) == (mean, "the ranks' power-limit constraints")
    shaped = shape_policy(job, PlanPolicy("eta", 0.5))
    assert dict(shaped.options)["max_power"] == mean
    # The request's own max_power comes before both.
    given = shape_policy(job, PlanPolicy("eta", 0.5, options=(("max_power", 400.0),)))
    assert dict(given.options)["max_power"] == 400.0
