"""Applied-clock verification against a real server.

Off-plan instructions in the status and ``/metrics``, a pipeline whose rank runs off-plan treated as
slow (its measured times), bad fields refused; and a real client whose simulated GPU is throttled.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import grpc
import httpx
import pytest

from perseus_client import PerseusClient, RankPosition, Reporting, SimulatedGpu
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import register, solved_job, wait_until
from ..rest.test_docs_openapi import Contract

THERMAL = "sw_thermal_slowdown"


def _counter(metrics: str, job: str, rank: int, reason: str) -> float:
    m = re.search(
        rf'^perseus_off_plan_instructions_total\{{perseus_job="{job}",rank="{rank}",reason="{reason}"\}}'
        r" (\S+)$",
        metrics,
        re.M,
    )
    return float(m.group(1)) if m else 0.0


def _off_plan(stage: int | None = 1, reasons: tuple[str, ...] = (THERMAL,)) -> Any:
    return pb.OffPlanInstruction(
        instruction="forward",
        microbatch=1,
        stage=stage,
        locked_mhz=1740,
        sampled_mhz=1200,
        reasons=list(reasons),
        samples=2,
    )


def test_an_off_plan_rank_shows_up_and_makes_its_pipeline_a_straggler(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    """Pipeline 1's leader (rank 2) reports the plan's time; its rank 3 runs off-plan and slower.

    Without the off-plan rule only the leader would count and nothing would happen.
    """
    job = solved_job(http, small_csv, data_parallel=2)
    ids = {g: register(stub, job, g, g % 2, data_rank=g // 2).rank_id for g in range(4)}
    status = http.get(f"/jobs/{job}/status").json()
    version = status["plan"]["version"]
    t_plan = status["plan"]["pipelines"][1]["time"]
    it = iter(range(1000))

    def report(g: int, t: float, off: list[Any], v: int) -> None:
        stub.ReportIterations(
            iter([pb.IterationReport(job_id=job, rank_id=ids[g], iteration=next(it),
                                     iteration_time=t, plan_version=v, off_plan=off,
                                     clock_samples=8 if g == 3 else 0,
                                     clock_event_reasons=[THERMAL] if off else [])]),
            timeout=10,
        )  # fmt: skip

    for _ in range(3):
        for g in range(3):
            report(g, t_plan, [], version)
        report(3, t_plan, [], version)  # samples, but on plan
    st = http.get(f"/jobs/{job}/status").json()
    clocks = st["ranks"][3]["applied_clocks"]
    assert clocks["off_plan"] is False and clocks["samples"] == 24
    assert "applied_clocks" not in st["ranks"][0]  # a rank that does not sample: no record
    assert "off_plan_ranks" not in st["pipelines"][1]
    for i in range(3):
        for g in range(3):
            report(g, t_plan, [], version)
        report(3, t_plan * 1.3, [_off_plan(), _off_plan(None, ())], version)
        if i < 2:
            assert http.get(f"/jobs/{job}/status").json()["plan"]["version"] == version
    # The status with the new fields, checked against the OpenAPI document (closed models).
    st = Contract(http).call("GET", "/jobs/{job_id}/status", 200, path={"job_id": job}).json()
    assert st["plan"]["version"] == version + 1
    p1 = st["pipelines"][1]
    assert p1["off_plan_ranks"] == [3]
    assert p1["straggler"] == {
        "time": pytest.approx(t_plan * 1.3 / st["iteration_overhead"]),
        "source": "detected",
        "cause": "off-plan clocks",
    }
    assert "off-plan clocks on rank(s) 3" in st["recent_replans"][-1]["why"]
    assert st["pipelines"][0]["straggler"] is None
    clocks = st["ranks"][3]["applied_clocks"]
    assert clocks["off_plan"] and clocks["off_plan_instructions"] == 6
    assert clocks["off_plan_iterations"] == 3 and clocks["reasons"] == [THERMAL]
    assert clocks["total_off_plan_instructions"] == 6 and clocks["window_iterations"] == 6
    assert clocks["last_off_plan"] == {
        "iteration": clocks["last_off_plan"]["iteration"],
        "instruction": "forward",
        "microbatch": 1,
        "stage": 1,
        "locked_mhz": 1740,
        "sampled_mhz": 1200,
        "reasons": [THERMAL],
    }
    metrics = http.get("/metrics").text
    assert _counter(metrics, job, 3, THERMAL) == 3 and _counter(metrics, job, 3, "none") == 3
    # Back on plan for a window: the leader feeds the detector again, the cause is gone.
    for _ in range(16):
        report(3, t_plan, [], version + 1)
    st = http.get(f"/jobs/{job}/status").json()
    assert "off_plan_ranks" not in st["pipelines"][1]
    assert st["ranks"][3]["applied_clocks"]["off_plan"] is False


def test_malformed_off_plan_fields_are_refused_naming_the_field(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv)
    rank = register(stub, job, 0, 0).rank_id
    bad = {
        "off_plan.instruction": _off_plan(),
        "off_plan.stage": _off_plan(stage=9),
        "off_plan.reasons": _off_plan(reasons=("Thermal; DROP",)),
        "clock_samples": None,
    }
    bad["off_plan.instruction"].instruction = "sideways"
    for field, off in bad.items():
        rep = pb.IterationReport(job_id=job, rank_id=rank, iteration=1, iteration_time=1.0)
        if off is None:
            rep.clock_samples = -1
        else:
            rep.off_plan.append(off)
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportIterations(iter([rep]), timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(field), (field, err.value.details())
    assert "applied_clocks" not in http.get(f"/jobs/{job}/status").json()["ranks"][0]


def _train(client: PerseusClient, iterations: int) -> None:
    plan = wait_until(lambda: client.latest_plan, "a plan", timeout=60.0)
    for _ in range(iterations):
        order = [(s.instruction, s.microbatch, s.stage) for s in (client.latest_plan or plan).steps]
        with client.iteration():
            for kind, mb, stage in order:
                with client.instruction(kind, microbatch=mb, stage=stage):
                    pass


def test_a_throttled_simulated_gpu_shows_up_in_status_and_metrics(
    server: ServerProcess, http: httpx.Client, small_csv: str
) -> None:
    """Real clients in threads: pipeline 0's rank and pipeline 1's two ranks.

    Rank 2 (pipeline 1, stage 1) runs on a GPU throttled to its lowest clock with a thermal
    reason.
    """
    job = solved_job(http, small_csv, data_parallel=2)
    ranks = {0: (0, 1), 1: (1, 0), 2: (1, 1)}  # global rank: (pipeline, stage)
    clients: dict[int, PerseusClient] = {}
    for g, (d, s) in ranks.items():
        gpu = SimulatedGpu.from_profile_csv(small_csv, stage=s, time_scale=0.1)
        clients[g] = PerseusClient(server.grpc_target, job, gpu=gpu, handle_signals=False, rank=RankPosition(global_rank=g, pipeline_rank=s, data_rank=d), reporting=Reporting(report_interval=0.05, clock_sample_interval=0.003))  # fmt: skip
    throttled = clients[2].gpu
    assert isinstance(throttled, SimulatedGpu)
    lowest = throttled.supported_clocks()[-1]
    throttled.throttle(lowest, reasons=(THERMAL,))
    try:
        threads = [threading.Thread(target=_train, args=(c, 14)) for c in clients.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        for c in clients.values():
            assert c.link.flush(timeout=10)
    finally:
        for c in clients.values():
            c.close()
    assert clients[2].last_report is not None
    st = http.get(f"/jobs/{job}/status").json()
    by_rank = {r["global_rank"]: r for r in st["ranks"]}
    clocks = by_rank[2]["applied_clocks"]
    assert clocks["off_plan"] and clocks["reasons"] == [THERMAL], clocks
    assert clocks["last_off_plan"]["sampled_mhz"] == lowest
    assert clocks["last_off_plan"]["locked_mhz"] > lowest
    for g in (0, 1):
        assert by_rank[g]["applied_clocks"]["off_plan"] is False
        assert by_rank[g]["applied_clocks"]["samples"] > 0
    assert st["pipelines"][1]["off_plan_ranks"] == [2]
    straggler = st["pipelines"][1]["straggler"]
    assert straggler is not None and straggler["cause"] == "off-plan clocks", st["pipelines"]
    # Its iterations ran off-plan: their slowness is the clocks', not a slow stage's.
    assert st["pipelines"][1]["slow_stages"] is None, st["pipelines"][1]
    assert st["pipelines"][0]["straggler"] is None
    assert _counter(http.get("/metrics").text, job, 2, THERMAL) >= 1


def test_made_up_reasons_count_as_other_and_series_leave_with_the_job(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv)
    rank = register(stub, job, 0, 0).rank_id
    reps = []
    for i in range(4):
        rep = pb.IterationReport(
            job_id=job, rank_id=rank, iteration=i, iteration_time=1.0, sequence=i + 1,
            clock_samples=10,
        )  # fmt: skip
        for k in range(300):
            rep.off_plan.append(_off_plan(reasons=(f"made_up_{i}_{k}", f"x{k}")))
        rep.off_plan.append(_off_plan(reasons=(THERMAL, "bogus")))
        rep.off_plan.append(_off_plan())
        reps.append(rep)
    assert stub.ReportIterations(iter(reps), timeout=30).accepted == 4
    metrics = http.get("/metrics").text
    series = re.findall(
        rf'^perseus_off_plan_instructions_total\{{perseus_job="{job}",', metrics, re.M
    )
    assert len(series) == 3
    assert _counter(metrics, job, 0, "other") == 4 * 300
    assert _counter(metrics, job, 0, re.escape(f"other+{THERMAL}")) == 4
    assert _counter(metrics, job, 0, THERMAL) == 4
    assert http.delete(f"/jobs/{job}").status_code == 204
    metrics = http.get("/metrics").text
    assert f'perseus_off_plan_instructions_total{{perseus_job="{job}"' not in metrics


def test_an_oversized_off_plan_is_refused_naming_the_field(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv)
    rank = register(stub, job, 0, 0).rank_id
    rep = pb.IterationReport(job_id=job, rank_id=rank, iteration=1, iteration_time=1.0)
    rep.off_plan.extend(_off_plan(reasons=()) for _ in range(4097))
    with pytest.raises(grpc.RpcError) as err:
        stub.ReportIterations(iter([rep]), timeout=30)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert details.startswith("off_plan") and "4096" in details, details
    del rep.off_plan[4096:]
    assert stub.ReportIterations(iter([rep]), timeout=30).accepted == 1


def test_off_plan_entries_count_in_the_size_that_offloads_a_report() -> None:
    import asyncio
    from types import SimpleNamespace

    from perseus_server.grpc.service import PlanServicer

    sizes: list[int] = []

    async def ingest(received: Any) -> tuple[int, int]:
        sizes.append(received.size)
        return 1, 0

    counter = SimpleNamespace(inc=lambda *a, **k: None)
    service = SimpleNamespace(ingest_report=ingest, metrics=SimpleNamespace(grpc_calls=counter))
    rep = pb.IterationReport(job_id="j", rank_id="r", iteration=1, iteration_time=1.0)
    rep.off_plan.extend(_off_plan() for _ in range(600))
    rep.instructions.add(instruction="forward", microbatch=0, frequency_mhz=1000, time=1, energy=1)

    async def stream() -> Any:
        yield rep

    servicer = PlanServicer(service, None)  # type: ignore[arg-type]
    ack = asyncio.run(servicer.ReportIterations(stream(), None))  # type: ignore[arg-type]
    assert ack.accepted == 1 and sizes == [601]
