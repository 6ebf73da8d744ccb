"""A job's profile uploaded, checked and stored (``service/job_profiles.py``).

Through a real :class:`PerseusService` on a SQLite file, no server: revisions counted in the
store, the clocks a rank registered checked against the profile, malformed text refused naming
the field. The REST route is ``tests/server/rest/test_profiles.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus_common.wire.values import RankRegistration
from perseus_server.config import Limits
from perseus_server.domain.errors import BadRequest, NotFound
from perseus_server.domain.jobs import JobSpec
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

from ..conftest import BLOCKING_A40


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "profiles.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def _job(service: PerseusService) -> str:
    spec = JobSpec(stages=2, microbatches=4, blocking_power=BLOCKING_A40)
    return str(service.create_job(spec)["id"])


def _put(service: PerseusService, job_id: str, text: str, kind: str = "text/csv") -> Any:
    return asyncio.run(service.profiles.put(job_id, text.encode(), kind))


def test_an_upload_is_stored_as_a_new_revision(service: PerseusService, small_csv: str) -> None:
    job_id = _job(service)
    with pytest.raises(NotFound, match="has no profile yet") as e:
        service.profiles.summary(job_id)
    assert e.value.field == "profile"
    first = _put(service, job_id, small_csv)
    freqs = sorted({int(line.split(",")[2]) for line in small_csv.splitlines()[1:]})
    assert (first["revision"], first["source"], first["stages"]) == (1, "upload", 2)
    assert sorted(first["frequencies"]) == freqs
    assert first["rows"] == len(small_csv.splitlines()) - 1
    assert _put(service, job_id, small_csv)["revision"] == 2
    text, revision, source = service.store.profile(job_id) or ("", 0, "")
    assert (revision, source) == (2, "upload") and text.splitlines()[0].startswith("stage,")
    assert service.profiles.get(job_id).stages == 2


def test_a_profile_with_a_clock_a_rank_lacks_is_refused(
    service: PerseusService, small_csv: str
) -> None:
    job_id = _job(service)
    service.register_rank(
        RankRegistration(job_id, 1, 1, 0, 0, "NVIDIA A40", supported_clocks_mhz=(1740,))
    )
    with pytest.raises(BadRequest, match=r"which rank 1 \(NVIDIA A40\) does not support") as e:
        _put(service, job_id, small_csv)
    assert e.value.field == "profile.frequency"
    assert service.store.profile(job_id) is None  # nothing stored


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("stage,instruction,frequency,time,energy\n0,forward,x,1,1\n", "profile."),
        ("{not json", "profile"),
    ],
)
def test_a_malformed_profile_names_its_field(
    service: PerseusService, body: str, field: str
) -> None:
    job_id = _job(service)
    with pytest.raises(BadRequest) as e:
        _put(service, job_id, body, "application/json" if body.startswith("{") else "text/csv")
    assert e.value.field is not None and e.value.field.startswith(field)
    with pytest.raises(BadRequest, match="not UTF-8") as bad:
        asyncio.run(service.profiles.put(job_id, b"\xff\xfe", "text/csv"))
    assert bad.value.field == "profile"
