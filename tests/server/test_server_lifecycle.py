"""Restart after SIGKILL, clean SIGTERM shutdown, concurrent / cancelled / crashing solves."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from perseus.profiles import load_profile
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from .conftest import A40, make_job, register, solved_job, wait_frontier

pytestmark = pytest.mark.slow


def _stages_csv(stages: int) -> str:
    p = load_profile(A40)
    rows = [r for r in p.records() if r["stage"] < stages]
    return "stage,instruction,frequency,time,energy\n" + "".join(
        f"{r['stage']},{r['instruction']},{r['frequency']},{r['time']!r},{r['energy']!r}\n"
        for r in rows
    )


def _running_worker(http: httpx.Client, job_id: str) -> int:
    for _ in range(600):
        st = http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json()
        if st["status"] == "running" and st.get("worker_pid"):
            return int(st["worker_pid"])
        time.sleep(0.05)
    raise AssertionError(f"the solve of {job_id} never started: {st}")


def _wait_gone(pid: int) -> None:
    for _ in range(600):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"solve worker {pid} outlived its killed server")


def test_state_survives_sigkill(tmp_path: Path, small_csv: str) -> None:
    srv = ServerProcess(tmp_path / "perseus.db", token="secret-token")
    try:
        srv.start()
        with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30) as http:
            job_id = solved_job(http, small_csv, data_parallel=2)
            dep = http.put(f"/jobs/{job_id}/plan", json={"slowdown": 0.1, "pipelines": [1]}).json()
            version = dep["version"]
            frontier = http.get(f"/jobs/{job_id}/frontier").json()
            profile = http.get(f"/jobs/{job_id}/profile").text
            job = http.get(f"/jobs/{job_id}").json()
            pending = make_job(http, stages=8, microbatches=96)  # a solve cut short by the kill
            http.put(
                f"/jobs/{pending}/profile",
                content=_stages_csv(8),
                headers={"content-type": "text/csv"},
            )
            http.post(f"/jobs/{pending}/frontier")
            worker = _running_worker(http, pending)
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            rank = register(
                stub, job_id, 3, pipeline_rank=1, data_rank=1, metadata=srv.grpc_metadata
            ).rank_id
            before = next(
                stub.WatchPlan(
                    pb.WatchPlanRequest(job_id=job_id, rank_id=rank),
                    metadata=srv.grpc_metadata,
                    timeout=10,
                )
            )
        srv.kill()
        # the orphaned solve worker notices its server is gone and exits
        _wait_gone(worker)
        srv.start()  # same database, new ports
        with httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30) as http:
            again = http.get(f"/jobs/{job_id}").json()
            # An active job's idle deadline counts from the new start (no rank has connected to
            # this process yet); everything stored is the same.
            assert again["lifecycle"].pop("idle_at") >= job["lifecycle"].pop("idle_at")
            assert again == job
            assert http.get(f"/jobs/{job_id}/profile").text == profile
            after = http.get(f"/jobs/{job_id}/frontier").json()
            assert after["points"] == frontier["points"] and after["status"] == "done"
            st = http.get(f"/jobs/{job_id}/status").json()
            assert st["plan"]["version"] == version
            assert [p["index"] for p in st["plan"]["pipelines"]] == [
                p["index"] for p in dep["pipelines"]
            ]
            lost = http.get(f"/jobs/{pending}/frontier").json()
            assert lost["status"] == "failed" and "restart" in lost["error"]
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            again = register(
                stub, job_id, 3, pipeline_rank=1, data_rank=1, metadata=srv.grpc_metadata
            )
            assert again.rank_id == rank and again.plan_version == version
            msg = next(
                stub.WatchPlan(
                    pb.WatchPlanRequest(job_id=job_id, rank_id=rank, known_version=version),
                    metadata=srv.grpc_metadata,
                    timeout=10,
                )
            )
            assert msg.version == version and list(msg.steps) == list(before.steps)
    finally:
        srv.close()


def test_sigterm_closes_streams_and_exits_cleanly(tmp_path: Path, small_csv: str) -> None:
    with ServerProcess(tmp_path / "perseus.db") as srv:
        with httpx.Client(base_url=srv.http_url, timeout=30) as http:
            job_id = solved_job(http, small_csv)
        channel = grpc.insecure_channel(srv.grpc_target)
        stub = pb_grpc.PlanServiceStub(channel)
        rank = register(stub, job_id, 0, 0).rank_id
        stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rank), timeout=60)
        assert next(stream).version == 1
        ended = threading.Event()

        def drain() -> None:
            try:
                for _ in stream:
                    pass
            except grpc.RpcError:
                pass
            ended.set()

        threading.Thread(target=drain, daemon=True).start()
        os.kill(srv.pid, signal.SIGTERM)
        assert ended.wait(30), "the WatchPlan stream was not closed on shutdown"
        assert srv.stop() == 0
        channel.close()
        assert "perseus: stopped" in srv.output()


@pytest.fixture(scope="module")
def medium_csv() -> str:
    return _stages_csv(8)


def test_two_concurrent_solves(http: httpx.Client, medium_csv: str) -> None:
    jobs = [make_job(http, stages=8, microbatches=16) for _ in range(2)]
    for j in jobs:
        assert (
            http.put(
                f"/jobs/{j}/profile", content=medium_csv, headers={"content-type": "text/csv"}
            ).status_code
            == 200
        )
    for j in jobs:
        assert http.post(f"/jobs/{j}/frontier").status_code == 202
    overlap = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = [http.get(f"/jobs/{j}/frontier", params={"points": False}).json() for j in jobs]
        pids = {s["worker_pid"] for s in st if s["status"] == "running"}
        overlap |= len(pids) == 2  # two distinct worker processes at the same time
        if all(s["status"] in ("done", "failed") for s in st):
            break
        time.sleep(0.05)
    assert overlap
    assert [wait_frontier(http, j)["status"] for j in jobs] == ["done", "done"]
    assert (
        http.get(f"/jobs/{jobs[0]}/frontier").json()["points"]
        == http.get(f"/jobs/{jobs[1]}/frontier").json()["points"]
    )


def test_cancelled_and_crashed_solves_fail_the_job(
    http: httpx.Client, medium_csv: str, small_csv: str
) -> None:
    big = _stages_csv(8)
    job_id = make_job(http, stages=8, microbatches=96)
    http.put(f"/jobs/{job_id}/profile", content=big, headers={"content-type": "text/csv"})
    http.post(f"/jobs/{job_id}/frontier")
    assert http.delete(f"/jobs/{job_id}/frontier").status_code == 202
    st = wait_frontier(http, job_id, timeout=60)
    assert st["status"] == "failed" and st["error"] == "cancelled by request"
    assert http.get(f"/jobs/{job_id}").json()["state"] == "failed"

    http.post(f"/jobs/{job_id}/frontier")
    deadline = time.monotonic() + 60
    pid = None
    while pid is None and time.monotonic() < deadline:
        pid = http.get(f"/jobs/{job_id}/frontier", params={"points": False}).json()["worker_pid"]
        time.sleep(0.02)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    st = wait_frontier(http, job_id, timeout=60)
    assert st["status"] == "failed" and "SIGKILL" in st["error"], st
    # The server keeps serving, and the job can be solved again.
    assert http.get("/healthz").status_code == 200
    metrics = http.get("/metrics").text
    assert (
        'perseus_solves_total{outcome="failed"}' in metrics
        and 'perseus_solves_total{outcome="cancelled"}' in metrics
    )
    other = solved_job(http, small_csv)
    assert http.get(f"/jobs/{other}").json()["state"] == "ready"
