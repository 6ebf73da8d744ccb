"""The service's one door (``service/facade.py``): jobs created, listed, deleted, reloaded.

On a real :class:`PerseusService` and SQLite file, no server: the caps a job creation checks,
a job's rank credential issued with it in one transaction, a deletion that forgets the job in
the store and everywhere, and the state rebuilt by another service on the same file. Every
route through the REST adapter is ``tests/server/rest/``; a report's path through the facade is
``test_reports_path.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_common.wire.values import RankRegistration
from perseus_server.config import Limits
from perseus_server.domain.errors import Conflict, NotFound
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

SPEC = JobSpec(stages=2, microbatches=4, data_parallel=2)  # 4 GPUs


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "facade.db"


def _service(db: Path, limits: Limits | None = None) -> Iterator[PerseusService]:
    store = SqlStore.open(db)
    try:
        service = PerseusService(store, limits or Limits())
        service.load()
        yield service
    finally:
        store.close()


@pytest.fixture
def service(db: Path) -> Iterator[PerseusService]:
    yield from _service(db)


def test_a_job_is_created_listed_and_paged(service: PerseusService) -> None:
    ids = [service.create_job(SPEC)["id"] for _ in range(3)]
    assert service.job(ids[1])["id"] == ids[1] and service.job_stages(ids[1]) == 2
    first = service.jobs_page(limit=2)
    assert [j["id"] for j in first["jobs"]] == ids[:2] and "next" in first
    rest = service.jobs_page(limit=2, after=first["next"])
    assert [j["id"] for j in rest["jobs"]] == ids[2:] and "next" not in rest
    assert service.health()["jobs"] == 3
    with pytest.raises(NotFound):
        service.require_job("nope")


def test_the_servers_caps_refuse_a_job_with_409_naming_why(db: Path) -> None:
    for service in _service(db, Limits(max_jobs=2, max_gpus=6)):
        service.create_job(SPEC)
        with pytest.raises(Conflict, match="hold 4 of its maximum of 6 GPUs") as gpus:
            service.create_job(SPEC)
        assert gpus.value.field == "max_gpus"
        service.create_job(JobSpec(stages=2, microbatches=4))
        with pytest.raises(Conflict, match="maximum of 2 jobs") as jobs:
            service.create_job(JobSpec(stages=2, microbatches=4))
        assert jobs.value.field == "job_id" and len(service.store.jobs()) == 2


def test_a_jobs_rank_credential_comes_with_it_and_only_with_a_token(
    service: PerseusService,
) -> None:
    assert "rank_credential" not in service.create_job(SPEC)
    creds = service.authority("admin-token")
    view = service.create_job(SPEC, credentials=creds)
    who = creds.identify(view["rank_credential"])
    assert who is not None and who.job_id == view["id"]


def test_a_deleted_job_is_forgotten_in_the_store_and_the_service(db: Path) -> None:
    for service in _service(db):
        gone, kept = service.create_job(SPEC)["id"], service.create_job(SPEC)["id"]
        service.register_rank(RankRegistration(gone, 0, 0, 0))
        asyncio.run(service.delete_job(gone))
        with pytest.raises(NotFound):
            service.job(gone)
        assert [j.id for j in service.store.jobs()] == [kept]
        assert service.store.ranks(gone) == []
    for again in _service(db):  # a restart: only the kept job comes back
        assert [j["id"] for j in again.jobs_page()["jobs"]] == [kept]
