"""The job, status and health documents (``service/views.py``), on a real service.

Paging jobs by cursor (a deleted job's cursor goes on, another tenant's id is no cursor) and a
status's ranks paged by global rank and bounded. The documents against the published schema are
``tests/server/rest/test_docs_openapi.py``; status pages over REST are
``tests/server/rest/test_job_status_pages.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_common.wire.values import RankRegistration
from perseus_server.config import Limits
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.views import MAX_STATUS_RANKS

SPEC = JobSpec(stages=2, microbatches=4)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "views.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def test_a_listing_goes_on_after_the_last_listed_job_is_deleted(service: PerseusService) -> None:
    ids = [service.create_job(SPEC)["id"] for _ in range(5)]
    page, cursor = service.views.jobs(2)
    assert [j["id"] for j in page] == ids[:2] and cursor is not None
    asyncio.run(service.delete_job(ids[1]))
    page, cursor = service.views.jobs(2, cursor)
    assert [j["id"] for j in page] == ids[2:4]
    page, cursor = service.views.jobs(2, ids[3])  # a plain job id (an older cursor) is taken
    assert [j["id"] for j in page] == ids[4:] and cursor is None


def test_a_tenants_listing_takes_no_other_tenants_id_as_a_cursor(
    service: PerseusService,
) -> None:
    service.create_tenant("team-a", {})
    theirs = service.create_job(SPEC)["id"]
    mine = service.create_job(SPEC, tenant="team-a")["id"]
    assert [j["id"] for j in service.views.jobs(10, tenant="team-a")[0]] == [mine]
    for bad in (theirs, "nope", "zz.x", "1" * 17 + ".x", "ab."):
        with pytest.raises(BadRequest, match="not a cursor of this listing") as e:
            service.views.jobs(10, bad, tenant="team-a")
        assert e.value.field == "after"


def test_a_status_pages_its_ranks_by_global_rank(service: PerseusService) -> None:
    job_id = service.create_job(JobSpec(stages=2, microbatches=4, data_parallel=3))["id"]
    for g in (4, 0, 5, 1):
        service.register_rank(RankRegistration(job_id, g, g % 2, g // 2, hostname=f"h{g}"))
    first = service.views.status(job_id, ranks=3)
    assert [r["global_rank"] for r in first["ranks"]] == [0, 1, 4]
    assert first["ranks_next"] == 4
    assert (first["expected_ranks"], first["registered_ranks"], first["connected_ranks"]) == (
        6,
        4,
        0,
    )
    assert first["state"] == "created" and len(first["pipelines"]) == 3
    rest = service.views.status(job_id, ranks=3, after=first["ranks_next"])
    assert [r["global_rank"] for r in rest["ranks"]] == [5] and rest["ranks_next"] is None
    assert rest["ranks"][0]["hostname"] == "h5" and rest["ranks"][0]["connected"] is False
    assert MAX_STATUS_RANKS >= 64


def test_health_counts_jobs_and_says_the_kernels_state(service: PerseusService) -> None:
    service.create_job(SPEC)
    health = service.views.health()
    assert health["status"] == "ok" and health["jobs"] == 1
    assert health["uptime_seconds"] >= 0 and health["kernels"] == "skipped"
