"""Online profiling driven by simulated ranks over real gRPC streams."""

from __future__ import annotations

import time

import httpx
import pytest

from perseus.profiles import parse_profile_csv
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc

from ..conftest import make_job, problem_field, register, wait_frontier

#: Energy multiplier per scanned frequency (highest first): falls, then rises twice in a row.
SHAPE = [1.0, 0.9, 0.8, 0.85, 0.9, 0.95]


def _reports(
    job_id: str, rank_id: str, msg: pb.PlanUpdate, count: int, csv_text: str, freqs: list[int]
) -> list[pb.IterationReport]:
    prof = parse_profile_csv(csv_text)
    f = msg.profiling.frequency_mhz
    shape = SHAPE[freqs.index(f)]
    out = []
    for it in range(count):
        rep = pb.IterationReport(
            job_id=job_id,
            rank_id=rank_id,
            iteration=it,
            iteration_time=1.0,
            plan_version=msg.version,
        )
        for s in msg.steps:
            p = prof[(s.stage, s.instruction)]
            i = list(p.frequencies).index(f)
            top = p.energies[0]
            rep.instructions.add(
                instruction=s.instruction,
                microbatch=s.microbatch,
                frequency_mhz=f,
                time=float(p.times[i]),
                energy=float(top * shape),
                stage=s.stage,
            )
        out.append(rep)
    return out


def test_online_profiling_scans_down_and_deploys(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str, small_freqs: list[int]
) -> None:
    job_id = make_job(http)
    r = http.post(f"/jobs/{job_id}/profiling", json={})
    assert (
        r.status_code == 409 and problem_field(r) == "frequencies"
    )  # no ranks yet: nothing to scan
    ranks = [register(stub, job_id, p, p, clocks=small_freqs).rank_id for p in (0, 1)]
    r = http.post(f"/jobs/{job_id}/profiling", json={"frequencies": [small_freqs[0], 1234]})
    assert r.status_code == 422 and problem_field(r) == "frequencies"
    r = http.post(f"/jobs/{job_id}/profiling", json={"iterations_per_frequency": 0})
    assert r.status_code == 422 and problem_field(r) == "iterations_per_frequency"

    streams = [
        stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rid), timeout=120)
        for rid in ranks
    ]
    st = http.post(
        f"/jobs/{job_id}/profiling",
        json={"warmup_iterations": 1, "iterations_per_frequency": 2, "stop_after_rises": 2},
    )
    assert st.status_code == 202, st.text
    assert (
        st.json()["frequencies"] == small_freqs and st.json()["current_frequency"] == small_freqs[0]
    )
    assert http.post(f"/jobs/{job_id}/profiling", json={}).status_code == 409
    assert http.get(f"/jobs/{job_id}").json()["state"] == "profiling"

    scanned = []
    while True:
        msgs = [next(s) for s in streams]
        if not msgs[0].HasField("profiling"):
            break
        f = msgs[0].profiling.frequency_mhz
        assert all(m.profiling.frequency_mhz == f and m.version == msgs[0].version for m in msgs)
        assert all(s.frequency_mhz == f for m in msgs for s in m.steps)
        assert msgs[0].profiling.warmup_iterations == 1 and msgs[0].profiling.iterations == 2
        scanned.append(f)
        for rid, m in zip(ranks, msgs, strict=True):
            # One report from an older version is ignored; then warm-up + measured iterations.
            stale = _reports(job_id, rid, m, 1, small_csv, small_freqs)
            stale[0].plan_version = m.version - 1
            ack = stub.ReportIterations(
                iter(stale + _reports(job_id, rid, m, 3, small_csv, small_freqs)), timeout=10
            )
            assert ack.accepted == 4
    # Energy fell twice then rose twice: the scan stops after the 5th frequency.
    assert scanned == small_freqs[:5]
    assert msgs[0].reason.startswith("online profiling finished") and all(
        s.frequency_mhz == small_freqs[0] for s in msgs[0].steps
    )
    plan = next(streams[0])  # the frontier of the measured profile, deployed by itself
    assert (
        not plan.HasField("profiling")
        and plan.version == msgs[0].version + 1
        and plan.expected_iteration_time > 0
    )
    assert wait_frontier(http, job_id)["status"] == "done"

    prog = http.get(f"/jobs/{job_id}/profiling").json()
    assert prog["status"] == "done"
    energies = [e["energy"] for e in prog["energy_per_iteration"]]
    assert (
        len(energies) == 5 and energies[1] < energies[0] and energies[4] > energies[3] > energies[2]
    )
    measured = parse_profile_csv(http.get(f"/jobs/{job_id}/profile").text)
    original = parse_profile_csv(small_csv)
    assert measured.frequencies == small_freqs[:5]
    for (stage, kind), p in measured.entries.items():
        o = original[(stage, kind)]
        assert p.times == pytest.approx(o.times[:5])
        assert p.energies == pytest.approx(o.energies[0] * __import__("numpy").array(SHAPE[:5]))
    st = http.get(f"/jobs/{job_id}/status").json()
    assert st["plan"]["kind"] == "plan" and st["plan"]["version"] == plan.version
    for s in streams:
        s.cancel()


def test_abort_profiling(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_freqs: list[int]
) -> None:
    job_id = make_job(http)
    rid = register(stub, job_id, 0, 0, clocks=small_freqs).rank_id
    assert http.delete(f"/jobs/{job_id}/profiling").status_code == 409
    assert http.get(f"/jobs/{job_id}/profiling").status_code == 404
    http.post(f"/jobs/{job_id}/profiling", json={"frequencies": small_freqs[:2]})
    stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rid), timeout=30)
    assert next(stream).profiling.frequency_mhz == small_freqs[0]
    assert http.delete(f"/jobs/{job_id}/profiling").json()["status"] == "aborted"
    after = next(stream)
    assert not after.HasField("profiling") and after.steps[0].frequency_mhz == small_freqs[0]
    time.sleep(0)
    stream.cancel()


def test_the_clients_warm_up_iterations_count_once(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str, small_freqs: list[int]
) -> None:
    """A real client reports its warm-up iterations without measurements.

    They are the warm-up, and the next ``iterations`` measured reports finish the clock (no
    second warm-up).
    """
    job_id = make_job(http)
    ranks = [register(stub, job_id, p, p, clocks=small_freqs).rank_id for p in (0, 1)]
    streams = [
        stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rid), timeout=60) for rid in ranks
    ]
    st = http.post(
        f"/jobs/{job_id}/profiling",
        json={
            "frequencies": small_freqs[:2],
            "warmup_iterations": 1,
            "iterations_per_frequency": 2,
        },
    )
    assert st.status_code == 202, st.text
    firsts = [next(s) for s in streams]
    assert firsts[0].profiling.frequency_mhz == small_freqs[0]
    for rid, m in zip(ranks, firsts, strict=True):
        reports = _reports(job_id, rid, m, 3, small_csv, small_freqs)
        del reports[0].instructions[:]  # the client's warm-up iteration: nothing measured
        for rep in reports[1:]:  # +-5 % noise, so that one measured iteration is not enough
            for i, ins in enumerate(rep.instructions):
                ins.time *= 1.05 if i % 2 else 0.95
        assert stub.ReportIterations(iter(reports), timeout=10).accepted == 3
    assert next(streams[0]).profiling.frequency_mhz == small_freqs[1]
    assert http.get(f"/jobs/{job_id}/profiling").json()["step"] == 1
    for s in streams:
        s.cancel()


def test_the_tolerance_parameter(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str, small_freqs: list[int]
) -> None:
    """``tolerance`` is a relative standard error in [0, 0.5] (422 naming it outside).

    A loose one finishes a clock after one measured iteration that the default would repeat.
    """
    job_id = make_job(http)
    ranks = [register(stub, job_id, p, p, clocks=small_freqs).rank_id for p in (0, 1)]
    for bad in (-0.001, 0.51, "x", True):
        r = http.post(f"/jobs/{job_id}/profiling", json={"tolerance": bad})
        assert r.status_code == 422 and problem_field(r) == "tolerance", r.text
    streams = [
        stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rid), timeout=60) for rid in ranks
    ]
    st = http.post(
        f"/jobs/{job_id}/profiling",
        json={"frequencies": small_freqs[:2], "warmup_iterations": 0, "tolerance": 0.5},
    )
    assert st.status_code == 202, st.text
    for rid, m in zip(ranks, [next(s) for s in streams], strict=True):
        reports = _reports(job_id, rid, m, 1, small_csv, small_freqs)
        for i, ins in enumerate(reports[0].instructions):  # +-5 %: the default 1 % repeats
            ins.time *= 1.05 if i % 2 else 0.95
        assert stub.ReportIterations(iter(reports), timeout=10).accepted == 1
    assert next(streams[0]).profiling.frequency_mhz == small_freqs[1]
    assert http.delete(f"/jobs/{job_id}/profiling").json()["status"] == "aborted"
    for edge in (0, 0.5):
        r = http.post(
            f"/jobs/{job_id}/profiling", json={"frequencies": small_freqs[:2], "tolerance": edge}
        )
        assert r.status_code == 202, r.text
        assert http.delete(f"/jobs/{job_id}/profiling").status_code == 200
    for s in streams:
        s.cancel()
