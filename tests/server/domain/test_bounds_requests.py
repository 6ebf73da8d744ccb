"""What one request can make the server build is bounded before it is built.

What one request can make the server build is bounded by its total before it is built, and a
report's transfers by what its rank can make in one iteration, from a link's two ends only (issue
#32 items 1-3): a stage selection of many long ranges, a report of 100,000 transfers, a rank timing
a link it is not an end of.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from perseus.profiles import ProfileError, parse_stage_list
from perseus_common.wire.values import IterationReport, RankRegistration, TransferReport
from perseus_server.config import Limits
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.jobs import JobSpec
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.report_checks import check_report

from ..conftest import sliced_profile_csv

#: The hostile query of the issue: 60 ranges of 100,000 stages each, 479 bytes.
AMPLIFYING = ",".join(["0-99999"] * 60)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[PerseusService]:
    store = SqlStore.open(tmp_path / "bounds.db")
    try:
        yield PerseusService(store, Limits())
    finally:
        store.close()


def test_a_stage_list_is_refused_by_its_total_before_it_is_built() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ProfileError) as e:
            parse_stage_list(AMPLIFYING)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.field == "stages" and "in all" in str(e.value)
    # Building the list first took hundreds of MiB (6 million ints); refusing it, nothing.
    assert peak < 1 << 20, peak
    with pytest.raises(ProfileError, match="more than 4 stages"):
        parse_stage_list("0-1,2-3,4", limit=4)
    assert parse_stage_list("4-7,0", limit=5) == [4, 5, 6, 7, 0]


def test_the_profile_upload_bounds_a_selection_by_the_jobs_stages(
    service: PerseusService,
) -> None:
    job = service.create_job(JobSpec(stages=2, microbatches=4, blocking_power=70.0))["id"]
    four = sliced_profile_csv(stages=4)
    with TestClient(create_app(service), base_url="http://localhost") as http:
        for query in (AMPLIFYING, "0-2"):
            r = http.put(
                f"/jobs/{job}/profile",
                params={"stages": query},
                content=four,
                headers={"content-type": "text/csv"},
            )
            assert r.status_code == 422, r.text
            assert r.json()["field"] == "stages"
            assert "more than 2 stages" in r.json()["detail"], r.text
        r = http.put(
            f"/jobs/{job}/profile",
            params={"stages": "1-2"},
            content=four,
            headers={"content-type": "text/csv"},
        )
        assert r.status_code == 200, r.text


def _job_with_ranks(
    service: PerseusService, stages: int, microbatches: int, **spec: object
) -> tuple[str, list[str]]:
    job = service.create_job(
        JobSpec(stages=stages, microbatches=microbatches, blocking_power=70.0, **spec)  # type: ignore[arg-type]
    )["id"]
    ranks = [
        service.registration.register(RankRegistration(job, r, r, 0)).rank_id for r in range(stages)
    ]
    return job, ranks


def _report(job: str, rank: str, transfers: list[TransferReport]) -> IterationReport:
    return IterationReport(job, rank, 1, 1.0, 0, transfers=tuple(transfers))


def _refusal(service: PerseusService, rep: IterationReport) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        check_report(service.jobs, service.limits, 0, rep)
    return e.value


def test_a_reports_transfers_are_bounded_by_what_its_rank_makes_in_one_iteration(
    service: PerseusService,
) -> None:
    from perseus_server.service.report_checks import transfers_per_iteration

    job_id, ranks = _job_with_ranks(service, 4, 4)
    job = service.jobs.get(job_id)
    # The first rank ends one boundary, a middle rank two: 2 directions x 4 microbatches each.
    assert [transfers_per_iteration(job, r) for r in range(4)] == [8, 16, 16, 8]
    every = [
        TransferReport(b, d, m, 0.001)
        for b in (0, 1)
        for d in ("forward", "backward")
        for m in range(4)
    ]
    check_report(
        service.jobs, service.limits, 0, _report(job_id, ranks[1], every)
    )  # all it makes: accepted
    err = _refusal(service, _report(job_id, ranks[1], [*every, every[0]]))
    assert err.field == "transfers" and "at most 16" in err.detail
    # The 100,000: refused by its count, naming the field.
    flood = [TransferReport(0, "forward", 0, 0.001)] * 100_000
    err = _refusal(service, _report(job_id, ranks[0], flood))
    assert err.field == "transfers" and "100000 transfers" in err.detail


def test_an_interleaved_rank_ends_every_boundary_of_its_model_stages(
    service: PerseusService,
) -> None:
    # Two ranks, two chunks each: model stages 0, 1, 2, 3 on ranks 0, 1, 0, 1; each rank ends
    # every one of the three boundaries once.
    job_id, ranks = _job_with_ranks(service, 2, 4, schedule="interleaved-1f1b", virtual_stages=2)
    from perseus_server.service.report_checks import transfers_per_iteration

    job = service.jobs.get(job_id)
    assert job.boundary_ends == ((0, 1), (1, 0), (0, 1))
    assert transfers_per_iteration(job, 0) == transfers_per_iteration(job, 1) == 3 * 2 * 4


def test_only_a_links_two_ends_may_report_its_transfers(service: PerseusService) -> None:
    job_id, ranks = _job_with_ranks(service, 4, 4)
    slow = [TransferReport(2, "forward", m, 0.4) for m in range(4)]
    err = _refusal(service, _report(job_id, ranks[0], slow))
    assert err.field == "transfers.boundary"
    assert "links pipeline ranks 2 and 3" in err.detail, err.detail
    for end in (2, 3):
        check_report(service.jobs, service.limits, 0, _report(job_id, ranks[end], slow))


class _Undecodable:
    """A received report of 100,000 transfers whose decoding fails the test."""

    size = 100_000
    transfers = 100_000

    def __init__(self, job_id: str, rank_id: str) -> None:
        self.job_id, self.rank_id = job_id, rank_id

    def decode(self) -> IterationReport:
        raise AssertionError("decoded a report its transfer count refuses")

    def wire(self) -> bytes:
        raise AssertionError("sent a report its transfer count refuses to be decoded")


def test_too_many_transfers_are_refused_before_the_report_is_decoded(
    service: PerseusService,
) -> None:
    job_id, ranks = _job_with_ranks(service, 4, 4)
    with pytest.raises(BadRequest) as e:
        asyncio.run(service.ingest_report(_Undecodable(job_id, ranks[0])))
    assert e.value.field == "transfers" and "at most 8" in e.value.detail


@pytest.mark.slow
def test_refused_large_reports_do_not_accumulate_in_memory(tmp_path: Path) -> None:
    """Refused large reports do not accumulate in memory: a bounded few stay.

    Each refused report of 100,000 transfers (4 MB) stayed in the gRPC runtime's reference
    cycles until a full garbage collection: sixty of them held 400 MiB. Now a bounded few.
    """
    import grpc

    from perseus_common.proto import perseus_pb2 as pb
    from perseus_common.proto import perseus_pb2_grpc as pb_grpc
    from perseus_server import ServerProcess

    def rss_mib(pid: int) -> float:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1024

    with ServerProcess(tmp_path / "p.db") as srv, grpc.insecure_channel(srv.grpc_target) as ch:
        import httpx

        job = httpx.post(f"{srv.http_url}/jobs", json={"stages": 2, "microbatches": 4,
                                                      "blocking_power": 70.0}).json()["id"]  # fmt: skip
        stub = pb_grpc.PlanServiceStub(ch)
        rank = stub.RegisterRank(pb.RegisterRankRequest(job_id=job)).rank_id
        rep = pb.IterationReport(job_id=job, rank_id=rank, iteration=1, iteration_time=1.0)
        for m in range(100_000):
            rep.transfers.add(boundary=0, direction="forward", microbatch=m % 4, time=0.001)
        codes: list[grpc.StatusCode] = []
        after: list[float] = []
        for n in range(60):
            try:
                stub.ReportIterations(iter([rep]), timeout=60)
            except grpc.RpcError as e:
                codes.append(e.code())
            if n in (19, 59):
                after.append(rss_mib(srv.pid))
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 60
    # Flat: the 40 refused after the first 20 add little (they added 4 MB each).
    grown = after[1] - after[0]
    assert grown < 60, f"40 more refused reports of 4 MB grew the server by {grown:.0f} MiB"
