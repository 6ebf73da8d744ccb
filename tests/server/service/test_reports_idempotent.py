"""Idempotent reports: a re-sent report is acknowledged and dropped, never counted twice.

A re-sent report has the same rank and a sequence not above the last accepted one (online profiling
included, across a restart). Reports without a sequence (old clients) are taken as before; within
one stream, a repeated or lower sequence is one duplicate, stored once.
"""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import httpx

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import make_job, register, solved_job
from ..sqlite_backend import connect
from .test_online_profiling import _reports


def _report(job_id: str, rank_id: str, it: int, seq: int) -> pb.IterationReport:
    return pb.IterationReport(
        job_id=job_id, rank_id=rank_id, iteration=it, iteration_time=1.0, plan_version=1,
        sequence=seq,
    )  # fmt: skip


def _accepted_total(http: httpx.Client) -> float:
    m = re.search(
        r"^perseus_iteration_reports_total(?:\{\})? (\S+)$", http.get("/metrics").text, re.M
    )
    return float(m.group(1)) if m else 0.0


def test_a_resent_batch_is_acknowledged_and_dropped(tmp_path: Path, small_csv: str) -> None:
    srv = ServerProcess(tmp_path / "perseus.db")
    srv.start()
    try:
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            job_id = solved_job(http, small_csv)
            with grpc.insecure_channel(srv.grpc_target) as ch:
                stub = pb_grpc.PlanServiceStub(ch)
                rank = register(stub, job_id, 0, 0).rank_id
                batch = [_report(job_id, rank, it, 100 + it) for it in range(3)]
                ack = stub.ReportIterations(iter(batch), timeout=10)
                assert (ack.accepted, ack.duplicates) == (3, 0)
                before = _accepted_total(http)
                # The client re-sends the whole batch after an error: nothing is counted twice.
                ack = stub.ReportIterations(
                    iter(batch + [_report(job_id, rank, 3, 103)]), timeout=10
                )
                assert (ack.accepted, ack.duplicates) == (4, 3)
                assert _accepted_total(http) == before + 1
                # Old clients (no sequence) are taken as they come, every time.
                old = [_report(job_id, rank, 9, 0)] * 2
                assert stub.ReportIterations(iter(old), timeout=10).duplicates == 0
                assert _accepted_total(http) == before + 3
        srv.stop()
        srv.start()  # the last sequence survives a restart
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            ack = stub.ReportIterations(iter(batch), timeout=10)
            assert (ack.accepted, ack.duplicates) == (3, 3)
            ack = stub.ReportIterations(iter([_report(job_id, rank, 4, 104)]), timeout=10)
            assert ack.duplicates == 0
    finally:
        srv.stop()


def test_online_profiling_does_not_count_duplicates(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str, small_freqs: list[int]
) -> None:
    job_id = make_job(http)
    ranks = [register(stub, job_id, p, p, clocks=small_freqs).rank_id for p in (0, 1)]
    streams = [
        stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rid), timeout=60) for rid in ranks
    ]
    r = http.post(
        f"/jobs/{job_id}/profiling",
        json={
            "frequencies": small_freqs[:3],
            "warmup_iterations": 0,
            "iterations_per_frequency": 2,
        },
    )
    assert r.status_code == 202, r.text
    msgs = [next(s) for s in streams]
    seq = 1000

    def noisy(rep: pb.IterationReport) -> pb.IterationReport:
        # +-5 % between microbatches: one measured iteration does not pin the means down, so
        # the clock needs its two iterations (the scan ends a clock early once they are known).
        for i, ins in enumerate(rep.instructions):
            ins.time *= 1.05 if i % 2 else 0.95
        return rep

    for rid, m in zip(ranks, msgs, strict=True):
        rep = noisy(_reports(job_id, rid, m, 1, small_csv, small_freqs)[0])
        rep.sequence = seq
        for _ in range(3):  # the same report, re-sent twice
            stub.ReportIterations(iter([rep]), timeout=10)
    prog = http.get(f"/jobs/{job_id}/profiling").json()
    assert prog["step"] == 0, prog  # one measured iteration per rank, not three: still step 0
    for rid, m in zip(ranks, msgs, strict=True):
        rep = noisy(_reports(job_id, rid, m, 1, small_csv, small_freqs)[0])
        rep.sequence, rep.iteration = seq + 1, 1
        stub.ReportIterations(iter([rep]), timeout=10)
    assert http.get(f"/jobs/{job_id}/profiling").json()["step"] == 1
    http.delete(f"/jobs/{job_id}/profiling")
    for s in streams:
        s.cancel()


def test_a_negative_sequence_is_refused(http: httpx.Client, stub: pb_grpc.PlanServiceStub) -> None:
    job_id = make_job(http)
    rank = register(stub, job_id, 0, 0).rank_id
    try:
        stub.ReportIterations(iter([_report(job_id, rank, 0, -5)]), timeout=10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.details().startswith("sequence")
    else:
        raise AssertionError("a negative sequence was accepted")


# --- duplicates within one stream -----------------------------------------------------------


def _stored(db: Path, rank: str) -> list[int]:
    with connect(db) as c:
        rows = c.execute("SELECT iteration FROM iterations WHERE rank_id = ? ORDER BY rowid", (rank,))  # fmt: skip
        return [int(r[0]) for r in rows]


def _counter(http: httpx.Client, name: str) -> float:
    m = re.search(rf"^{name}(?:\{{\}})? (\S+)$", http.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_repeated_or_lower_sequence_within_one_stream_is_one_duplicate(
    server: ServerProcess, http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv, data_parallel=2)
    a = register(stub, job, 0, 0, 0).rank_id
    b = register(stub, job, 2, 0, 1).rank_id

    def rep(rank: str, it: int, seq: int) -> pb.IterationReport:
        return pb.IterationReport(
            job_id=job, rank_id=rank, iteration=it, iteration_time=1.0, plan_version=1, sequence=seq
        )  # fmt: skip

    stored = _counter(http, "perseus_iteration_reports_total")
    dups = _counter(http, "perseus_duplicate_reports_total")
    stream = [
        rep(a, 1, 10),
        rep(a, 2, 10),  # the same sequence again: a duplicate
        rep(a, 3, 11),
        rep(a, 4, 7),  # lower than one already sent: a duplicate
        rep(b, 1, 10),  # another rank's sequences are its own
        rep(a, 5, 11),  # equal to the highest: a duplicate
        rep(a, 6, 12),
    ]
    ack = stub.ReportIterations(iter(stream), timeout=10)
    assert (ack.accepted, ack.duplicates) == (7, 3)
    assert _stored(server.db_path, a) == [1, 3, 6]
    assert _stored(server.db_path, b) == [1]
    assert _counter(http, "perseus_iteration_reports_total") == stored + 4
    assert _counter(http, "perseus_duplicate_reports_total") == dups + 3
    st = http.get(f"/jobs/{job}/status").json()
    assert {r["rank_id"]: r["last_iteration"] for r in st["ranks"]} == {a: 6, b: 1}
