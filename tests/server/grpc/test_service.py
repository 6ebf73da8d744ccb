"""gRPC PlanService against a real server: registration, plan push, reports, status codes."""

from __future__ import annotations

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_common.wire.values import PlanUpdate
from perseus_server.grpc.plan_encoder import PlanEncoder
from perseus_server.grpc.service import serialized

from ..conftest import make_job, register, solved_job


def _code(excinfo: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    return excinfo.value.code()  # type: ignore[attr-defined]


def test_register_and_reconnect(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_freqs: list[int]
) -> None:
    job_id = make_job(http, data_parallel=2)
    first = register(stub, job_id, 3, pipeline_rank=1, data_rank=1, clocks=small_freqs)
    assert (
        first.rank_id and first.plan_version == 0 and first.stages == 2 and first.microbatches == 4
    )
    assert first.max_clock_mhz == max(small_freqs)
    again = register(stub, job_id, 3, pipeline_rank=1, data_rank=1, clocks=small_freqs)
    assert again.rank_id == first.rank_id
    st = http.get(f"/jobs/{job_id}/status").json()
    assert st["registered_ranks"] == 1 and st["ranks"][0]["rank_id"] == first.rank_id


@pytest.mark.parametrize(
    ("kwargs", "code", "field"),
    [
        ({"global_rank": 9, "pipeline_rank": 0}, grpc.StatusCode.INVALID_ARGUMENT, "global_rank"),
        ({"global_rank": 0, "pipeline_rank": 2}, grpc.StatusCode.INVALID_ARGUMENT, "pipeline_rank"),
        (
            {"global_rank": 0, "pipeline_rank": 0, "data_rank": 1},
            grpc.StatusCode.INVALID_ARGUMENT,
            "data_rank",
        ),
        (
            {"global_rank": 0, "pipeline_rank": 0, "clocks": [-5]},
            grpc.StatusCode.INVALID_ARGUMENT,
            "supported_clocks_mhz",
        ),
        (
            {"global_rank": 0, "pipeline_rank": 1},
            grpc.StatusCode.FAILED_PRECONDITION,
            "global_rank",
        ),
        (
            {"global_rank": 1, "pipeline_rank": 0},
            grpc.StatusCode.FAILED_PRECONDITION,
            "global_rank",
        ),
    ],
)
def test_bad_registrations(
    http: httpx.Client,
    stub: pb_grpc.PlanServiceStub,
    kwargs: dict,
    code: grpc.StatusCode,
    field: str,
) -> None:
    job_id = make_job(http)
    register(stub, job_id, 0, pipeline_rank=0)
    with pytest.raises(grpc.RpcError) as e:
        register(stub, job_id, **kwargs)
    assert _code(e) == code and e.value.details().startswith(field), e.value.details()  # type: ignore[attr-defined]
    assert http.get(f"/jobs/{job_id}/status").json()["registered_ranks"] == 1


def test_register_unknown_job_and_unsupported_clocks(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        register(stub, "no-such-job", 0, 0)
    assert _code(e) == grpc.StatusCode.NOT_FOUND
    job_id = make_job(http)
    http.put(f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"})
    with pytest.raises(grpc.RpcError) as e:
        register(stub, job_id, 0, 0, clocks=[1410, 1200])
    assert (
        _code(e) == grpc.StatusCode.INVALID_ARGUMENT and "supported_clocks_mhz" in e.value.details()
    )  # type: ignore[attr-defined]


def test_no_plan_means_no_message(http: httpx.Client, stub: pb_grpc.PlanServiceStub) -> None:
    job_id = make_job(http)
    rank = register(stub, job_id, 0, 0)
    stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rank.rank_id), timeout=1.0)
    with pytest.raises(grpc.RpcError) as e:
        next(stream)
    assert _code(e) == grpc.StatusCode.DEADLINE_EXCEEDED


def test_watch_errors(http: httpx.Client, stub: pb_grpc.PlanServiceStub) -> None:
    job_id = make_job(http)
    for req, code in (
        (pb.WatchPlanRequest(job_id="nope", rank_id="x"), grpc.StatusCode.NOT_FOUND),
        (pb.WatchPlanRequest(job_id=job_id, rank_id="x"), grpc.StatusCode.FAILED_PRECONDITION),
    ):
        with pytest.raises(grpc.RpcError) as e:
            next(stub.WatchPlan(req, timeout=10))
        assert _code(e) == code


def _freqs(msg: pb.PlanUpdate) -> list[int]:
    return [s.frequency_mhz for s in msg.steps]


def test_push_current_then_new_versions_per_pipeline(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job_id = make_job(http, data_parallel=2)
    ranks = {
        (p, d): register(stub, job_id, d * 2 + p, pipeline_rank=p, data_rank=d).rank_id
        for p in (0, 1)
        for d in (0, 1)
    }
    streams = {
        k: stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=r), timeout=120)
        for k, r in ranks.items()
    }
    http.put(f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"})
    http.post(f"/jobs/{job_id}/frontier")
    first = {
        k: next(s) for k, s in streams.items()
    }  # the default plan arrives by itself after the solve
    fastest = http.get(f"/jobs/{job_id}/plan", params={"index": 0, "steps": True}).json()
    for (p, _d), msg in first.items():
        assert msg.version == 1 and not msg.HasField("profiling")
        assert [(s.instruction, s.microbatch, s.stage, s.frequency_mhz) for s in msg.steps] == [
            (s["instruction"], s["microbatch"], s["stage"], s["frequency"])
            for s in fastest["steps"][p]
        ]
        assert msg.expected_iteration_time == pytest.approx(fastest["time"])
    slow = http.get(f"/jobs/{job_id}/plan", params={"slowdown": 0.15}).json()
    http.put(f"/jobs/{job_id}/plan", json={"slowdown": 0.15, "pipelines": [1]})
    second = {k: next(s) for k, s in streams.items()}
    for (p, d), msg in second.items():
        assert msg.version == 2
        want = slow["frequencies"][p] if d == 1 else fastest["frequencies"][p]
        assert _freqs(msg) == want
    # A reconnecting rank gets the current version at once; its new stream replaces the old
    # one (a rank holds one), so the job still has 4 connected ranks while it stays open.
    reconnected = stub.WatchPlan(
        pb.WatchPlanRequest(job_id=job_id, rank_id=ranks[(1, 1)], known_version=1), timeout=10
    )
    again = next(reconnected)
    assert again.version == 2 and _freqs(again) == slow["frequencies"][1]
    st = http.get(f"/jobs/{job_id}/status").json()
    assert st["connected_ranks"] == 4
    with pytest.raises(grpc.RpcError) as replaced:
        next(streams[(1, 1)])
    assert _code(replaced) == grpc.StatusCode.ABORTED
    reconnected.cancel()
    # Deleting the job ends the streams with NOT_FOUND.
    assert http.delete(f"/jobs/{job_id}").status_code == 204
    with pytest.raises(grpc.RpcError) as e:
        next(streams[(0, 0)])
    assert _code(e) == grpc.StatusCode.NOT_FOUND


def _report(job_id: str, rank_id: str, it: int, t: float, version: int = 0) -> pb.IterationReport:
    return pb.IterationReport(
        job_id=job_id, rank_id=rank_id, iteration=it, iteration_time=t, plan_version=version
    )


def test_report_iterations(http: httpx.Client, stub: pb_grpc.PlanServiceStub) -> None:
    job_id = make_job(http)
    rank = register(stub, job_id, 0, 0).rank_id
    ack = stub.ReportIterations(
        iter([_report(job_id, rank, i, 1.0 + i / 100) for i in range(5)]), timeout=10
    )
    assert ack.accepted == 5
    st = http.get(f"/jobs/{job_id}/status").json()
    assert st["ranks"][0]["last_iteration"] == 4 and st["ranks"][0][
        "last_iteration_time"
    ] == pytest.approx(1.04)
    assert [x["iteration"] for x in st["pipelines"][0]["recent_iterations"]] == [0, 1, 2, 3, 4]
    bad = [
        (_report(job_id, rank, 5, -1.0), grpc.StatusCode.INVALID_ARGUMENT, "iteration_time"),
        (
            _report(job_id, rank, 5, float("nan")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "iteration_time",
        ),
        (_report(job_id, "ghost", 5, 1.0), grpc.StatusCode.FAILED_PRECONDITION, "rank_id"),
        (_report("nope", rank, 5, 1.0), grpc.StatusCode.NOT_FOUND, "job_id"),
    ]
    m = pb.IterationReport(job_id=job_id, rank_id=rank, iteration=5, iteration_time=1.0)
    m.instructions.add(
        instruction="jump", microbatch=0, frequency_mhz=1000, time=0.1, energy=1.0, stage=0
    )
    bad.append((m, grpc.StatusCode.INVALID_ARGUMENT, "instructions.instruction"))
    for rep, code, field in bad:
        with pytest.raises(grpc.RpcError) as e:
            stub.ReportIterations(iter([rep]), timeout=10)
        assert _code(e) == code and e.value.details().startswith(field), e.value.details()  # type: ignore[attr-defined]
    assert http.get(f"/jobs/{job_id}/status").json()["ranks"][0]["last_iteration"] == 4


def test_solved_job_registration_reports_version(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job_id = solved_job(http, small_csv)
    assert register(stub, job_id, 1, 1).plan_version == 1


def test_responses_go_out_as_given_bytes_or_serialized() -> None:
    msg = pb.ReportAck(accepted=3)
    assert serialized(msg) == msg.SerializeToString()
    data = PlanEncoder()(PlanUpdate(4, (), "r"))
    assert serialized(data) is data
