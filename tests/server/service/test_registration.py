"""Ranks joining their job (``service/registration.py``), on a real service and SQLite store.

The same rank registering again keeps its identity; a position is held by one rank; malformed
registrations are refused naming the field. Registration over real gRPC is
``tests/server/grpc/test_methods.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_common.wire.values import RankRegistration
from perseus_server.config import Limits
from perseus_server.domain.errors import BadRequest, Conflict, NotFound
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.registration import MAX_POWER_W

A40 = (1740, 1410, 210)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "reg.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def _job(service: PerseusService) -> str:
    return str(service.create_job(JobSpec(stages=2, microbatches=4, data_parallel=2))["id"])


def _reg(job_id: str, g: int, **kw: object) -> RankRegistration:
    fields: dict[str, object] = {"gpu_name": "NVIDIA A40", "supported_clocks_mhz": A40}
    fields.update(kw)
    return RankRegistration(job_id, g, g % 2, g // 2, 0, **fields)  # type: ignore[arg-type]


def test_a_rank_registers_once_and_again_gets_the_same_identity(service: PerseusService) -> None:
    job_id = _job(service)
    first = service.registration.register(_reg(job_id, 3, supported_clocks_mhz=(210, 1740)))
    assert first.rank_id.startswith(f"{job_id}-3-")
    assert (first.stages, first.microbatches, first.max_clock_mhz) == (2, 4, 1740)
    again = service.registration.register(_reg(job_id, 3, hostname="moved"))
    assert again.rank_id == first.rank_id
    (stored,) = service.store.ranks(job_id)
    assert stored.rank_id == first.rank_id and stored.hostname == "moved"
    assert stored.supported_clocks == A40  # fastest first


def test_a_position_is_held_by_one_rank(service: PerseusService) -> None:
    job_id = _job(service)
    service.registration.register(_reg(job_id, 0))
    with pytest.raises(Conflict, match="is registered as pipeline_rank=0") as moved:
        service.registration.register(RankRegistration(job_id, 0, 1, 0))
    with pytest.raises(Conflict, match=r"\(0, 0, 0\) is taken by global_rank 0") as taken:
        service.registration.register(RankRegistration(job_id, 2, 0, 0))
    assert moved.value.field == taken.value.field == "global_rank"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"global_rank": 4}, "global_rank"),
        ({"pipeline_rank": 2}, "pipeline_rank"),
        ({"data_rank": -1}, "data_rank"),
        ({"tensor_rank": 1}, "tensor_rank"),
        ({"supported_clocks_mhz": (0, 1410)}, "supported_clocks_mhz"),
        ({"max_power_limit_w": MAX_POWER_W + 1}, "max_power_limit_w"),
        ({"max_power_limit_w": math.nan}, "max_power_limit_w"),
        ({"hostname": "h" * 10_000}, "hostname"),
    ],
)
def test_a_malformed_registration_names_its_field(
    service: PerseusService, change: dict[str, object], field: str
) -> None:
    job_id = _job(service)
    fields: dict[str, object] = {
        "job_id": job_id, "global_rank": 1, "pipeline_rank": 1, "data_rank": 0, "tensor_rank": 0,
    }  # fmt: skip
    fields.update(change)
    with pytest.raises(BadRequest) as e:
        service.registration.register(RankRegistration(**fields))  # type: ignore[arg-type]
    assert e.value.field == field
    assert service.store.ranks(job_id) == []  # nothing stored


def test_unknown_jobs_and_unregistered_ranks_are_refused(service: PerseusService) -> None:
    with pytest.raises(NotFound):
        service.registration.register(_reg("no-such-job", 0))
    job_id = _job(service)
    with pytest.raises(Conflict, match="call RegisterRank first") as e:
        service.registration.subscribe(job_id, f"{job_id}-0-nope")
    assert e.value.field == "rank_id"
