"""The partial frontier's life in a real server.

A solve's first plan stored and deployed (a plan version pushed to a real WatchPlan stream) while
the rest is computed, plan queries answered from it and saying so, then the whole frontier replacing
it with the deployment re-decided on it (a higher version); a cancel in between keeps the first
plan; a fast solve deploys only its whole frontier. And the kernel warm-up at start: solves wait for
it, ``/healthz`` says so.

The partial phase is stretched by the test-only ``PERSEUS_TEST_SOLVE_DELAY`` (the worker waits
that long after sending its first plan), the warm-up by ``PERSEUS_TEST_WARM_DELAY``.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus.problem import EnergyProblem
from perseus.profiles import parse_profile_csv
from perseus.schedules import one_f_one_b
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime.solve_manager import SolveEvents, SolveLimits, SolveManager
from perseus_server.runtime.warmup import WARM_ENV
from perseus_server.service.solves import decode_frontier
from perseus_server.testing.fault_hooks import TEST_SOLVE_DELAY_ENV, TEST_WARM_DELAY_ENV

from ..conftest import BLOCKING_A40, make_job, register, wait_frontier

pytestmark = pytest.mark.slow

#: Seconds the worker waits after its first plan (the partial phase).
DELAY = 6.0


def _until(fn: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"not reached: {what}"
        time.sleep(0.05)


class Watcher:
    """A real WatchPlan stream read on a thread; its messages come through ``next``."""

    def __init__(self, target: str, job_id: str, rank_id: str) -> None:
        self.channel = grpc.insecure_channel(target)
        stub = pb_grpc.PlanServiceStub(self.channel)
        self.stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=rank_id))
        self.messages: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for msg in self.stream:
                self.messages.put(msg)
        except grpc.RpcError:
            pass

    def next(self, timeout: float = 60.0) -> Any:
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "perseus.db", env={TEST_SOLVE_DELAY_ENV: str(DELAY)}) as srv:
        yield srv


def _job_with_ranks(srv: ServerProcess, http: httpx.Client, csv: str) -> tuple[str, Watcher]:
    job_id = make_job(http, data_parallel=2)
    r = http.put(f"/jobs/{job_id}/profile", content=csv, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text
    with grpc.insecure_channel(srv.grpc_target) as ch:
        stub = pb_grpc.PlanServiceStub(ch)
        rank = register(stub, job_id, 0, 0).rank_id
        register(stub, job_id, 1, 0, data_rank=1)
    return job_id, Watcher(srv.grpc_target, job_id, rank)


def test_first_plan_deployed_then_remapped_to_the_whole_frontier(
    slow_server: ServerProcess, small_csv: str
) -> None:
    srv = slow_server
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        job_id, watch = _job_with_ranks(srv, http, small_csv)
        try:
            assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
            first = watch.next()
            assert first.version == 1 and len(first.steps) == 2 * 4
            # While the rest is computed: every view says partial and answers from one point.
            st = http.get(f"/jobs/{job_id}/status").json()
            assert st["state"] == "solving"
            assert st["frontier"]["status"] == "partial" and st["frontier"]["partial"] is True
            assert st["frontier"]["num_points"] == 1
            plan = st["plan"]
            assert plan["version"] == 1 and plan["partial"] is True
            assert [p["index"] for p in plan["pipelines"]] == [0, 0]
            fr = http.get(f"/jobs/{job_id}/frontier").json()
            assert fr["status"] == "partial" and fr["partial"] is True
            assert len(fr["points"]) == 1 and fr["points"][0]["time"] <= fr["max_frequency_time"]
            assert first.expected_iteration_time == pytest.approx(fr["points"][0]["time"])
            doc = http.get(f"/jobs/{job_id}/plan", params={"index": 0}).json()
            assert doc["partial"] is True and doc["index"] == 0 and doc["slowdown"] <= 1e-12
            by_slowdown = http.get(f"/jobs/{job_id}/plan", params={"slowdown": 0.1}).json()
            assert by_slowdown["index"] == 0 and by_slowdown["partial"] is True
            assert http.get(f"/jobs/{job_id}/plan", params={"index": 1}).status_code == 422
            view = http.get(f"/jobs/{job_id}").json()
            assert view["frontier_status"] == "partial" and view["plan_version"] == 1
            # A policy chosen during the partial phase is deployed now and kept afterwards.
            dep = http.put(f"/jobs/{job_id}/plan", json={"slowdown": 0.1}).json()
            assert dep["version"] == 2 and dep["partial"] is True
            assert watch.next().version == 2
            # The whole frontier replaces it; the deployment is re-decided on it.
            full = watch.next(timeout=120)
            assert full.version == 3
            fr = http.get(f"/jobs/{job_id}/frontier").json()
            assert fr["status"] == "done" and "partial" not in fr and len(fr["points"]) >= 2
            st = http.get(f"/jobs/{job_id}/status").json()
            plan = st["plan"]
            assert plan["version"] == 3 and "partial" not in plan
            assert plan["policy"] == {"kind": "slowdown", "value": 0.1}
            want = http.get(f"/jobs/{job_id}/plan", params={"slowdown": 0.1}).json()
            assert "partial" not in want
            assert [p["index"] for p in plan["pipelines"]] == [want["index"]] * 2
            assert full.expected_iteration_time == pytest.approx(want["time"])
            assert st["frontier"]["status"] == "done" and st["state"] == "ready"
        finally:
            watch.close()


def test_a_cancel_during_the_partial_phase_keeps_the_first_plan(
    slow_server: ServerProcess, small_csv: str
) -> None:
    srv = slow_server
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        job_id, watch = _job_with_ranks(srv, http, small_csv)
        try:
            assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
            assert watch.next().version == 1
            assert http.delete(f"/jobs/{job_id}/frontier").status_code == 202
            st = wait_frontier(http, job_id)
            assert st["status"] == "failed" and "cancel" in st["error"]
            assert st["partial"] is True and st["num_points"] == 1
            status = http.get(f"/jobs/{job_id}/status").json()
            assert status["plan"]["version"] == 1 and status["plan"]["partial"] is True
            assert http.get(f"/jobs/{job_id}/plan", params={"index": 0}).json()["partial"] is True
            with pytest.raises(queue.Empty):
                watch.next(timeout=1.0)  # nothing new was pushed
        finally:
            watch.close()
    # Restarted, the first plan is still what is stored and deployed.
    srv.stop()
    srv.env = None
    srv.start()
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        fr = http.get(f"/jobs/{job_id}/frontier").json()
        assert fr["partial"] is True and len(fr["points"]) == 1
        assert http.get(f"/jobs/{job_id}/status").json()["plan"]["version"] == 1
        # Solving again (same profile) skips the first plan: the whole frontier comes at once.
        assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
        st = wait_frontier(http, job_id)
        assert st["status"] == "done" and "partial" not in st
        plan = http.get(f"/jobs/{job_id}/status").json()["plan"]
        assert plan["version"] == 2 and "partial" not in plan


# --- the solve manager's hand-over of the first plan (in process, real workers) ------------------


def _solve(
    csv: str, *, delay: float, first_plan_after: float, cancel_after_first: bool = False
) -> tuple[list[str], Any]:
    """Run one solve; returns the events in order and the last frontier handed over."""
    events: list[str] = []
    last: list[Any] = [None]

    async def main() -> None:
        manager = SolveManager(1, limits=SolveLimits(first_plan_after=first_plan_after))
        done = asyncio.get_running_loop().create_future()

        def first(doc: str, frontier: Any) -> None:
            events.append("first")
            last[0] = frontier
            if cancel_after_first:
                manager.cancel("job", "cancelled by request")

        def finished(kind: str, value: Any = None) -> None:
            events.append(kind)
            if value is not None:
                last[0] = value
            done.set_result(None)

        manager.start(
            "job",
            csv,
            one_f_one_b(2, 4).to_json(),
            BLOCKING_A40,
            SolveEvents(
                lambda pid: None,
                lambda f: None,
                lambda doc, s, f: finished("done", f),
                lambda why: finished("failed"),
                decode_frontier,
                first,
            ),
        )
        await asyncio.wait_for(done, 120)

    old = os.environ.get(TEST_SOLVE_DELAY_ENV)
    os.environ[TEST_SOLVE_DELAY_ENV] = str(delay)
    try:
        asyncio.run(main())
    finally:
        if old is None:
            del os.environ[TEST_SOLVE_DELAY_ENV]
        else:
            os.environ[TEST_SOLVE_DELAY_ENV] = old
    return events, last[0]


def test_a_solve_that_ends_within_the_grace_hands_over_only_its_frontier(small_csv: str) -> None:
    events, frontier = _solve(small_csv, delay=0.0, first_plan_after=30.0)
    assert events == ["done"] and len(frontier) >= 2


def test_a_slow_solve_hands_over_its_verified_first_plan_first(small_csv: str) -> None:
    events, _ = _solve(small_csv, delay=2.0, first_plan_after=0.2)
    assert events == ["first", "done"]
    events, first = _solve(small_csv, delay=5.0, first_plan_after=0.2, cancel_after_first=True)
    assert events == ["first", "failed"]
    assert len(first) == 1
    # its true time, recomputed from the profile: no slower than every instruction at max clock
    problem = EnergyProblem.build(parse_profile_csv(small_csv), one_f_one_b(2, 4), BLOCKING_A40)
    true = problem.evaluate(first.plans[0])
    assert true.time == pytest.approx(first.times[0], rel=1e-9)
    assert true.time <= problem.evaluate(problem.max_frequency_plan()).time * (1 + 1e-12)


# --- warm-up ---------------------------------------------------------------------------------------


def test_solves_wait_for_the_kernel_warm_up_and_healthz_says_so(
    tmp_path: Path, small_csv: str
) -> None:
    env = {TEST_WARM_DELAY_ENV: "4", WARM_ENV: "1"}
    with (
        ServerProcess(tmp_path / "perseus.db", env=env) as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        health = http.get("/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok" and health.json()["kernels"] == "warming"
        job_id = make_job(http)
        r = http.put(f"/jobs/{job_id}/profile", content=small_csv,
                     headers={"content-type": "text/csv"})  # fmt: skip
        assert r.status_code == 200
        assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
        time.sleep(1.0)
        st = http.get(f"/jobs/{job_id}/frontier").json()
        assert st["status"] == "queued" and st["worker_pid"] is None  # held: no worker yet
        assert http.get("/healthz").json()["kernels"] == "warming"
        _until(lambda: http.get("/healthz").json()["kernels"] == "ready", "kernels ready")
        assert wait_frontier(http, job_id)["status"] == "done"
        assert "solver kernels warm in" in srv.output()


def test_the_warm_up_can_be_skipped(tmp_path: Path) -> None:
    with (
        ServerProcess(tmp_path / "perseus.db", env={WARM_ENV: "0"}) as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        assert http.get("/healthz").json()["kernels"] == "skipped"


def test_a_held_solve_stays_queued_and_a_cancel_does_not_wait_for_the_warm_up() -> None:
    async def main() -> None:
        manager = SolveManager(1, poll_interval=0.01)
        warm: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        manager.hold_until(warm)
        seen: list[str] = []
        events = SolveEvents(
            lambda pid: seen.append("running"),
            lambda f: None,
            lambda *a: seen.append("done"),
            lambda why: seen.append(f"failed: {why}"),
        )
        manager.start("a", "", {}, 0.0, events)
        await asyncio.sleep(0.2)
        assert manager.holding and manager.queued() == 1 and seen == []
        manager.cancel("a", "cancelled by request")
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == ["failed: cancelled by request"] and not warm.done()
        warm.set_result(None)
        assert not manager.holding

    asyncio.run(main())
