"""Crash at every step of a solve's completion, a deployment and a profiling finish, and restart.

A real server exits at a named point (``PERSEUS_FAULT``); after the restart every endpoint answers
and the state is the one before or after the step. A job whose stored state is unreadable is marked
failed while the server starts anyway.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.testing.fault_hooks import (
    FAULT_ENV,
    FAULT_EXIT_CODE,
    POINTS,
    TEST_SOLVE_DELAY_ENV,
)

from ..conftest import make_job, register, solved_job, wait_frontier
from ..routes import app_routes
from ..service.test_online_profiling import _reports
from ..sqlite_backend import corrupt_column

pytestmark = pytest.mark.slow


def wait_exit(srv: ServerProcess, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while srv.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.returncode is not None, "the server did not reach its fault point"
    return srv.returncode


def restart(srv: ServerProcess, fault: str | None = None) -> None:
    srv.env = {FAULT_ENV: fault} if fault else None
    srv.start()


def check_everything_answers(tmp: Path, srv: ServerProcess, job_id: str) -> dict[str, Any]:
    """Every GET route answers below 500 for the job, and WatchPlan serves the stored plan."""
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        for route in app_routes(tmp):
            if "GET" not in route.methods:
                continue
            r = http.get(route.path.replace("{job_id}", job_id))
            assert r.status_code < 500, f"GET {route.path}: {r.status_code} {r.text[:300]}"
        status = http.get(f"/jobs/{job_id}/status").json()
        frontier = http.get(f"/jobs/{job_id}/frontier").json()
    plan = status["plan"]
    if plan is not None and plan["kind"] == "plan":
        assert frontier["status"] == "done" or frontier.get("points"), (plan, frontier)
        n = len(frontier["points"])
        assert all(0 <= p["index"] < n for p in plan["pipelines"]), (plan, n)
    ranks = status["ranks"]
    if ranks and plan is not None:
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stream = pb_grpc.PlanServiceStub(ch).WatchPlan(
                pb.WatchPlanRequest(job_id=job_id, rank_id=ranks[0]["rank_id"]), timeout=10
            )
            msg = next(stream)
            assert msg.version == plan["version"]
            stream.cancel()
    return {"status": status, "frontier": frontier}


def solve_until_the_fault(srv: ServerProcess, small_csv: str) -> str:
    """A job with a profile and one registered rank whose solve runs into the server's fault point.

    The server is restarted after it died there. Returns the job's id.
    """
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        job_id = make_job(http)
        r = http.put(
            f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"}
        )
        assert r.status_code == 200
        with grpc.insecure_channel(srv.grpc_target) as ch:
            register(pb_grpc.PlanServiceStub(ch), job_id, 0, 0)
        assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
    assert wait_exit(srv) == FAULT_EXIT_CODE
    restart(srv)
    return job_id


@pytest.mark.parametrize("point", ["after_frontier_store", "after_solve_commit"])
def test_a_crash_during_solve_completion(tmp_path: Path, small_csv: str, point: str) -> None:
    srv = ServerProcess(tmp_path / "perseus.db", env={FAULT_ENV: point})
    srv.start()
    try:
        job_id = solve_until_the_fault(srv, small_csv)
        state = check_everything_answers(tmp_path, srv, job_id)
        if point == "after_frontier_store":  # before: nothing of the completion was committed
            assert state["frontier"]["status"] == "failed"
            assert "interrupted" in state["frontier"]["error"]
            # No deployment of the completion; a first plan committed before it (the partial
            # frontier's, when the solve was slow enough to send one) may stay, marked partial.
            plan = state["status"]["plan"]
            assert plan is None or plan.get("partial") is True, plan
        else:  # after: frontier and deployment both
            assert state["frontier"]["status"] == "done"
            assert state["status"]["plan"]["kind"] == "plan"
    finally:
        srv.stop()


@pytest.mark.parametrize("point", ["after_partial_store", "after_partial_commit"])
def test_a_crash_during_the_partial_frontier(tmp_path: Path, small_csv: str, point: str) -> None:
    """A crash while the first plan is stored, or after it while the rest is computed."""
    srv = ServerProcess(tmp_path / "perseus.db", env={FAULT_ENV: point, TEST_SOLVE_DELAY_ENV: "30"})
    srv.start()
    try:
        job_id = solve_until_the_fault(srv, small_csv)
        state = check_everything_answers(tmp_path, srv, job_id)
        frontier, plan = state["frontier"], state["status"]["plan"]
        assert frontier["status"] == "failed" and "interrupted" in frontier["error"]
        if point == "after_partial_store":  # before: nothing of the first plan was committed
            assert plan is None and "points" not in frontier
        else:  # after: the first plan stored as a partial frontier, and deployed
            assert frontier["partial"] is True and len(frontier["points"]) == 1
            assert plan["version"] == 1 and plan["partial"] is True
            with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
                assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
                assert wait_frontier(http, job_id)["status"] == "done"
            state = check_everything_answers(tmp_path, srv, job_id)
            assert "partial" not in state["frontier"] and state["status"]["plan"]["version"] == 2
    finally:
        srv.stop()


def test_every_fault_point_is_tested() -> None:
    tested = {
        "after_frontier_store",
        "after_solve_commit",
        "after_partial_store",
        "after_partial_commit",
        "after_deployment_store",
        "after_profile_store",
        "after_profiling_commit",
    }
    assert set(POINTS) == tested


def test_a_crash_during_deployment(tmp_path: Path, small_csv: str) -> None:
    srv = ServerProcess(tmp_path / "perseus.db")
    srv.start()
    try:
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            job_id = solved_job(http, small_csv)
            with grpc.insecure_channel(srv.grpc_target) as ch:
                register(pb_grpc.PlanServiceStub(ch), job_id, 0, 0)
            before = http.get(f"/jobs/{job_id}/status").json()["plan"]["version"]
        srv.stop()
        restart(srv, "after_deployment_store")
        with (
            httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
            pytest.raises(httpx.HTTPError),
        ):
            http.put(f"/jobs/{job_id}/plan", json={"index": 1})
        assert wait_exit(srv) == FAULT_EXIT_CODE
        restart(srv)
        state = check_everything_answers(tmp_path, srv, job_id)
        assert state["status"]["plan"]["version"] == before
    finally:
        srv.stop()


@pytest.mark.parametrize("point", ["after_profile_store", "after_profiling_commit"])
def test_a_crash_during_profiling_finish(
    tmp_path: Path, small_csv: str, small_freqs: list[int], point: str
) -> None:
    srv = ServerProcess(tmp_path / "perseus.db", env={FAULT_ENV: point})
    srv.start()
    try:
        with (
            httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
            grpc.insecure_channel(srv.grpc_target) as ch,
        ):
            stub = pb_grpc.PlanServiceStub(ch)
            job_id = make_job(http)
            ranks = [register(stub, job_id, p, p, clocks=small_freqs).rank_id for p in (0, 1)]
            streams = [
                stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rid), timeout=120)
                for rid in ranks
            ]
            freqs = small_freqs[:2]
            r = http.post(
                f"/jobs/{job_id}/profiling",
                json={"frequencies": freqs, "warmup_iterations": 0, "iterations_per_frequency": 1},
            )
            assert r.status_code == 202, r.text
            with pytest.raises(grpc.RpcError):  # the server exits under the last report
                while True:
                    msgs = [next(s) for s in streams]
                    assert msgs[0].HasField("profiling")
                    for rid, m in zip(ranks, msgs, strict=True):
                        stub.ReportIterations(
                            iter(_reports(job_id, rid, m, 1, small_csv, small_freqs)), timeout=10
                        )
        assert wait_exit(srv) == FAULT_EXIT_CODE
        restart(srv)
        state = check_everything_answers(tmp_path, srv, job_id)
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            prof = http.get(f"/jobs/{job_id}/profiling").json()
            stored = http.get(f"/jobs/{job_id}/profile")
        if point == "after_profile_store":  # before: the scan's last step, no profile
            assert prof["status"] == "running"
            assert stored.status_code == 404
        else:  # after: profile stored, profiling solving (interrupted by the restart)
            assert stored.status_code == 200
            assert prof["status"] in ("failed", "done")
            assert state["frontier"]["status"] in ("failed", "done")
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def two_solved_jobs(
    tmp_path_factory: pytest.TempPathFactory, small_csv: str
) -> tuple[Path, str, str]:
    """A stopped server's database with two solved jobs: ``(its folder, one id, the other)``.

    Each test of an unreadable row spoils its own copy (the server has exited, so the files are
    the whole database): one server and two solves for the four tests instead of one each.
    """
    folder = tmp_path_factory.mktemp("two-solved-jobs")
    with (
        ServerProcess(folder / "perseus.db") as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        bad = solved_job(http, small_csv)
        good = solved_job(http, small_csv)
    return folder, bad, good


@pytest.mark.parametrize(
    ("table", "column"),
    [("frontiers", "doc"), ("deployments", "doc"), ("profiles", "csv"), ("jobs", "spec")],
)
def test_an_unreadable_row_fails_its_job_not_the_server(
    tmp_path: Path, two_solved_jobs: tuple[Path, str, str], table: str, column: str
) -> None:
    template, bad, good = two_solved_jobs
    shutil.copytree(template, tmp_path / "db")
    db = tmp_path / "db" / "perseus.db"
    corrupt_column(db, table, column, bad)
    with ServerProcess(db) as srv, httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        assert wait_frontier(http, good)["status"] == "done"
        check_everything_answers(tmp_path, srv, good)
        if table == "jobs":
            assert http.get(f"/jobs/{bad}").status_code == 404  # left out, with a log line
            assert "cannot be read" in srv.output()
        else:
            view = http.get(f"/jobs/{bad}").json()
            assert view["state"] == "failed"
            st = http.get(f"/jobs/{bad}/frontier", params={"points": False}).json()
            assert "cannot be read" in st["error"]
            check_everything_answers(tmp_path, srv, bad)
