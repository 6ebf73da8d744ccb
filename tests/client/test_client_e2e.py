"""End to end against a real ``perseus serve`` subprocess.

Registration, plans, reports, version swaps at iteration boundaries, server restart, fail-open,
SIGTERM, online profiling.
"""

from __future__ import annotations

import csv
import io
import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from perseus_client import (
    Connection,
    FailOpen,
    PerseusClient,
    RankPosition,
    RecordingGpu,
    Reporting,
    SimulatedGpu,
)

pytestmark = pytest.mark.slow

TOKEN = "e2e-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def start_server(tmp_path: Any, grpc_port: int = 0) -> Any:
    from perseus_server.testing.process import ServerProcess

    return ServerProcess(tmp_path / "perseus.db", token=TOKEN, grpc_port=grpc_port).start()


def http(srv: Any) -> httpx.Client:
    return httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30)


def create_job(srv: Any, profile_csv: str | None) -> str:
    with http(srv) as c:
        r = c.post(
            "/jobs",
            json={"stages": 2, "microbatches": 2, "schedule": "1f1b", "blocking_power": 50.0},
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        if profile_csv is not None:
            r = c.put(
                f"/jobs/{job}/profile", content=profile_csv, headers={"content-type": "text/csv"}
            )
            assert r.status_code == 200, r.text
            assert c.post(f"/jobs/{job}/frontier").status_code == 202
            wait_for(lambda: c.get(f"/jobs/{job}/status").json()["plan"], "the default plan")
    return job


def make_client(
    srv: Any, job: str, rank: int, profile_data: Any, **kw: Any
) -> tuple[PerseusClient, RecordingGpu]:
    rec = RecordingGpu(SimulatedGpu(profile_data, stage=rank, time_scale=0))
    opts: dict[str, Any] = {
        "token": TOKEN,
        "handle_signals": False,
        "reporting": Reporting(report_interval=0.05),
        "connection": Connection(backoff_max=0.3),
    }
    opts.update(kw)
    client = PerseusClient(
        srv.grpc_target,
        job,
        gpu=rec,
        rank=RankPosition(global_rank=rank, pipeline_rank=rank),
        **opts,
    )
    return client, rec


def run_iteration(client: PerseusClient, order: list[tuple[str, int, int]]) -> None:
    with client.iteration():
        for kind, mb, stage in order:
            with client.instruction(kind, microbatch=mb, stage=stage):
                pass


def order_of(client: PerseusClient) -> list[tuple[str, int, int]]:
    plan = wait_for(lambda: client.latest_plan, "a plan")
    return [(s.instruction, s.microbatch, s.stage) for s in plan.steps]


@pytest.fixture(scope="module")
def server(tmp_path_factory: Any) -> Iterator[Any]:
    srv = start_server(tmp_path_factory.mktemp("srv"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def job(server: Any, profile_text: str) -> str:
    return create_job(server, profile_text)


def test_ranks_run_the_deployed_plan_and_reports_reach_the_server(server, job, profile_data):
    clients = [make_client(server, job, r, profile_data) for r in (0, 1)]
    try:
        for client, rec in clients:
            order = order_of(client)
            for _ in range(3):
                run_iteration(client, order)
            plan = client.plan
            assert plan is not None and plan.version >= 1
            # The clock in effect for every instruction is the plan's clock for it.
            assert [(i.kind, i.microbatch, i.mhz) for i in rec.instructions] == [
                (s.instruction, s.microbatch, s.frequency_mhz) for s in plan.steps
            ] * 3
            assert client.connected and client.rank_id
    finally:
        for client, _ in clients:
            client.close()
    with http(server) as c:
        status = c.get(f"/jobs/{job}/status").json()
    by_rank = {r["global_rank"]: r for r in status["ranks"]}
    for r, (client, _) in enumerate(clients):
        assert by_rank[r]["last_iteration"] == 2
        assert by_rank[r]["last_plan_version"] == client.plan_version
        assert by_rank[r]["supported_clocks_mhz"] == [1410, 1200, 1000]


def test_a_new_plan_version_swaps_in_at_the_next_iteration_boundary(server, job, profile_data):
    client, rec = make_client(server, job, 0, profile_data)
    try:
        order = order_of(client)
        run_iteration(client, order)
        old = client.plan
        with http(server) as c:
            points = c.get(f"/jobs/{job}/frontier").json()["num_points"]
            with client.iteration():
                for n, (kind, mb, stage) in enumerate(order):
                    if n == 1:  # a new version is deployed mid-iteration
                        r = c.put(f"/jobs/{job}/plan", json={"index": points - 1})
                        assert r.status_code == 200, r.text
                        wait_for(
                            lambda: client.latest_plan.version > old.version, "the new version"
                        )
                    with client.instruction(kind, microbatch=mb, stage=stage):
                        pass
            assert client.plan is old  # the whole iteration ran the old version
            run_iteration(client, order)
            new = client.plan
            assert new.version > old.version
            assert [s.frequency_mhz for s in new.steps] != [s.frequency_mhz for s in old.steps]
            n = len(order)
            assert [i.mhz for i in rec.instructions[n : 2 * n]] == [
                s.frequency_mhz for s in old.steps
            ]
            assert [i.mhz for i in rec.instructions[2 * n :]] == [
                s.frequency_mhz for s in new.steps
            ]
            c.put(f"/jobs/{job}/plan", json={"index": 0})
    finally:
        client.close()


def test_wrong_token_is_reported_and_training_runs_at_max_clock(server, job, profile_data):
    client, rec = make_client(
        server, job, 1, profile_data, token="wrong", fail_open=FailOpen(server_timeout=0.0)
    )
    try:
        wait_for(
            lambda: client.link.last_error and "UNAUTHENTICATED" in client.link.last_error,
            "auth error",
        )
        with client.iteration(), client.instruction("forward", microbatch=0):
            pass
        assert client.failed_open and rec.instructions[-1].mhz == 1410
    finally:
        client.close()


TRAINER = textwrap.dedent(
    """
    import sys, time
    from perseus_client import PerseusClient, RankPosition, SimulatedGpu

    target, job, token, state = sys.argv[1:5]
    profile = {(0, "forward"): {1410: (0.01, 3.0), 1200: (0.012, 2.6), 1000: (0.015, 2.4)},
               (0, "backward"): {1410: (0.02, 6.0), 1200: (0.024, 5.2), 1000: (0.030, 4.8)}}
    gpu = SimulatedGpu(profile, stage=0, time_scale=200.0, state_path=state)
    client = PerseusClient(target, job, token=token, gpu=gpu, rank=RankPosition(global_rank=0, pipeline_rank=0))
    while client.latest_plan is None:
        time.sleep(0.01)
    order = [(s.instruction, s.microbatch, s.stage) for s in client.latest_plan.steps]
    while True:
        with client.iteration():
            for kind, mb, stage in order:
                with client.instruction(kind, microbatch=mb, stage=stage):
                    print("RUNNING", kind, mb, gpu.locked_clock, flush=True)
    """
)


def test_sigterm_mid_iteration_resets_clocks_of_a_connected_rank(server, job, tmp_path):
    with http(server) as c:
        last = c.get(f"/jobs/{job}/frontier").json()["num_points"] - 1
        assert c.put(f"/jobs/{job}/plan", json={"index": last}).status_code == 200
        planned = c.get(f"/jobs/{job}/plan", params={"index": last}).json()["frequencies"][0]
    state = tmp_path / "gpu.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, server.grpc_target, job, TOKEN, str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().split()  # inside the first instruction (seconds long)
        assert line[:1] == ["RUNNING"], proc.stderr.read()
        assert int(line[3]) == planned[0] < 1410  # locked at the plan's (low) clock
        assert json.loads(state.read_text())["locked_clock_mhz"] == planned[0]
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM
    doc = json.loads(state.read_text())
    assert doc["locked_clock_mhz"] is None and doc["resets"] >= 1
    with http(server) as c:
        c.put(f"/jobs/{job}/plan", json={"index": 0})


def test_server_restart_is_invisible_and_fail_open_runs_max_clocks(
    tmp_path, profile_text, profile_data
):
    port = free_port()
    srv = start_server(tmp_path, grpc_port=port)
    try:
        job = create_job(srv, profile_text)
        steady, steady_rec = make_client(
            srv, job, 0, profile_data, fail_open=FailOpen(server_timeout=60.0)
        )
        eager, eager_rec = make_client(
            srv, job, 1, profile_data, fail_open=FailOpen(server_timeout=0.3)
        )
        orders = {0: order_of(steady), 1: order_of(eager)}
        for _ in range(2):
            run_iteration(steady, orders[0])
            run_iteration(eager, orders[1])
        plan0, plan1 = steady.plan, eager.plan

        srv.kill()  # a crash: no goodbye on the streams
        wait_for(lambda: not steady.connected and not eager.connected, "the streams to break")
        for _ in range(5):  # training goes on, on the last plan
            run_iteration(steady, orders[0])
        assert steady.plan is plan0 and not steady.failed_open
        assert [i.mhz for i in steady_rec.instructions[-len(orders[0]) :]] == [
            s.frequency_mhz for s in plan0.steps
        ]
        wait_for(lambda: eager.link.unreachable_for() > 0.3, "the fail-open timeout")
        run_iteration(eager, orders[1])  # past its timeout: max clocks
        assert eager.failed_open and eager.plan is None
        assert {i.mhz for i in eager_rec.instructions[-len(orders[1]) :]} == {1410}

        srv.start()  # same database, same gRPC port
        wait_for(lambda: steady.connected and eager.connected, "reconnection", timeout=60)
        run_iteration(steady, orders[0])
        run_iteration(eager, orders[1])
        assert not eager.failed_open and eager.plan.version == plan1.version
        assert [i.mhz for i in eager_rec.instructions[-len(orders[1]) :]] == [
            s.frequency_mhz for s in plan1.steps
        ]
        assert steady.link.reconnects >= 1 and steady.rank_id == steady.link.rank_id
        # Reports queued while the server was down arrive after the reconnection.
        last = steady.iterations - 1

        def delivered() -> bool:
            with http(srv) as c:
                ranks = c.get(f"/jobs/{job}/status").json()["ranks"]
            return any(r["global_rank"] == 0 and r["last_iteration"] == last for r in ranks)

        wait_for(delivered, "the queued reports")
        steady.close()
        eager.close()
    finally:
        srv.stop()


def test_online_profiling_end_to_end(server, profile_data):
    job = create_job(server, None)
    clients = [make_client(server, job, r, profile_data) for r in (0, 1)]
    try:
        with http(server) as c:
            r = c.post(
                f"/jobs/{job}/profiling",
                json={
                    "frequencies": [1410, 1200, 1000],
                    "warmup_iterations": 1,
                    "iterations_per_frequency": 2,
                    "stop_after_rises": 3,
                },
            )
            assert r.status_code == 202, r.text
            orders = [order_of(cl) for cl, _ in clients]
            seen_profiling_clocks: set[int] = set()
            for _ in range(400):
                for (cl, _), order in zip(clients, orders, strict=True):
                    run_iteration(cl, order)
                    if cl.plan is not None and cl.plan.profiling is not None:
                        seen_profiling_clocks.add(cl.plan.profiling.frequency_mhz)
                time.sleep(0.02)
                prof = c.get(f"/jobs/{job}/profiling").json()
                if prof["status"] not in ("running",):
                    break
            assert prof["status"] in ("solving", "done"), prof
            assert seen_profiling_clocks == {1410, 1200, 1000}
            # Every clock measured: the server assembled exactly the simulated profile.
            text = c.get(f"/jobs/{job}/profile", params={"format": "csv"}).text
            rows = list(csv.DictReader(io.StringIO(text)))
            assert len(rows) == 12
            for row in rows:
                t, e = profile_data[(int(row["stage"]), row["instruction"])][
                    int(float(row["frequency"]))
                ]
                assert float(row["time"]) == pytest.approx(t, rel=1e-6)
                assert float(row["energy"]) == pytest.approx(e, abs=1.01e-3)  # counter: integer mJ
            # Then the server solves and deploys a plan by itself.
            dep = wait_for(
                lambda: (c.get(f"/jobs/{job}/status").json()["plan"] or {}).get("kind") == "plan",
                "the deployed plan after profiling",
            )
            assert dep
        cl0 = clients[0][0]
        wait_for(lambda: cl0.latest_plan.profiling is None and cl0.latest_plan.steps, "the plan")
        run_iteration(cl0, orders[0])
        assert cl0.plan.profiling is None
    finally:
        for cl, _ in clients:
            cl.close()
