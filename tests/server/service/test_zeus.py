"""Zeus runs (``service/zeus.py``): a run's prototype found and checked, on a real service.

Which job a run's ``job_metadata`` names (an id, a unique name, the server's default; within the
caller's tenant), and each prototype a run cannot take refused by its field, saying what to do.
Runs served to Zeus's own client end to end are ``tests/server/rest/test_zeus_routes.py`` and
``tests/client/integrations/test_zeus_e2e.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_server.config import Limits, ZeusConfig
from perseus_server.domain.errors import ApiError, BadRequest, Conflict
from perseus_server.domain.jobs import JobSpec
from perseus_server.domain.rows import JobRow
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.state import Job
from perseus_server.service.zeus import ZeusJobInfo, zeus_order_problem

from ..conftest import BLOCKING_A40


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "zeus.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def _spec(name: str, schedule: str = "1f1b", **kw: int) -> JobSpec:
    return JobSpec(
        stages=2, microbatches=4, name=name, schedule=schedule, blocking_power=BLOCKING_A40, **kw
    )


def _info(metadata: str | None, pp: int = 2, dp: int = 1, world: int = 2) -> ZeusJobInfo:
    return ZeusJobInfo("", pp, dp, 1, world, metadata)


def _refusal(service: PerseusService, info: ZeusJobInfo, **kw: object) -> ApiError:
    runs = service.zeus_runs(ZeusConfig(**kw))  # type: ignore[arg-type]
    with pytest.raises(ApiError) as e:
        runs.register_job(None, info)
    return e.value


def test_only_the_synchronous_1f1b_is_a_zeus_clients_order() -> None:
    for schedule, kw, ok in [
        ("1f1b", {}, True),
        ("gpipe", {}, False),
        ("interleaved_1f1b", {"virtual_stages": 2}, False),
    ]:
        spec = _spec("p", schedule, **kw)
        job = Job(row=JobRow("j", 0.0, spec), schedule=spec.build_schedule())
        problem = zeus_order_problem(job)
        assert (problem is None) == ok, schedule
        if not ok:
            assert problem is not None and "make the prototype with schedule 1f1b" in problem


def test_a_run_names_its_prototype_or_is_told_how(service: PerseusService) -> None:
    e = _refusal(service, _info(None))
    assert isinstance(e, BadRequest) and e.field == "job_metadata"
    assert "--zeus-default-prototype" in e.detail
    e = _refusal(service, _info("nobody"))
    assert e.field == "job_metadata" and "no job named 'nobody'" in e.detail
    service.create_job(_spec("twin"))
    service.create_job(_spec("twin"))
    e = _refusal(service, _info("twin"))
    assert isinstance(e, Conflict) and "2 jobs are named 'twin'" in e.detail
    proto = service.create_job(_spec("solo"))["id"]
    e = _refusal(service, _info(None), default_prototype="solo")  # found: then checked
    assert isinstance(e, Conflict) and f"job {proto}) has no profile" in e.detail
    e = _refusal(service, _info(proto))  # by id too
    assert isinstance(e, Conflict) and "has no profile" in e.detail


def test_a_prototype_the_run_cannot_take_is_refused_by_its_field(
    service: PerseusService, small_csv: str
) -> None:
    proto = service.create_job(_spec("proto"))["id"]
    gpipe = service.create_job(_spec("gp", "gpipe"))["id"]
    for info, field, words in [
        (ZeusJobInfo("given", 2, 1, 1, 2, proto), "job_id", "must be empty"),
        (_info(proto, world=3), "world_size", "got 3"),
        (_info(proto, pp=1, world=1), "pp_degree", "has 2 pipeline stages"),
        (_info(gpipe), "job_metadata", "synchronous 1F1B"),
    ]:
        e = _refusal(service, info)
        assert e.field == field and words in e.detail, (field, e.detail)
    asyncio.run(service.put_profile(proto, small_csv.encode(), "text/csv"))
    e = _refusal(service, _info(proto))
    assert isinstance(e, Conflict) and "has no frontier" in e.detail
    assert len(service.store.jobs()) == 2  # no run was made
