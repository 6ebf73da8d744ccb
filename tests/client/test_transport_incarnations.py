"""A restarted rank is never muted by its previous run's report sequences.

The issue: a rank that restarts on a host whose clock is behind, or after a report with sequence
2^63-1, had every report acknowledged as a duplicate and stored nowhere.

Real processes: a ``perseus serve`` subprocess and trainer subprocesses built on
``PerseusClient``, each a new client incarnation; the second one runs with its clock set back a
day (``time.time_ns`` of that process, which seeds its report sequence).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2, perseus_pb2_grpc
from perseus_server import ServerProcess

pytestmark = pytest.mark.slow

TOKEN = "incarnation-token"
ITERATIONS = 5

TRAINER = textwrap.dedent(
    """
    import json, sys, time
    shift_ns = int(float(sys.argv[3]) * 1e9)
    real_time_ns = time.time_ns
    time.time_ns = lambda: real_time_ns() + shift_ns  # this host's clock, set back or ahead
    from perseus_client import PerseusClient, RankPosition, Reporting, SimulatedGpu

    profile = {(0, "forward"): {1410: (0.01, 3.0)}, (0, "backward"): {1410: (0.02, 6.0)}}
    gpu = SimulatedGpu(profile, time_scale=0.0)
    client = PerseusClient(sys.argv[1], sys.argv[2], token=sys.argv[4], gpu=gpu, handle_signals=False, strict=False, rank=RankPosition(global_rank=0), reporting=Reporting(report_interval=0.05))
    assert client.link.wait_registered(30)
    for _ in range(int(sys.argv[5])):
        with client.iteration():
            with client.instruction("forward", microbatch=0):
                pass
            with client.instruction("backward", microbatch=0):
                pass
    deadline = time.monotonic() + 30
    while client.link.queued and time.monotonic() < deadline:
        client.link.flush(timeout=5)
    print(json.dumps({"incarnation": client.link.incarnation, "sent": client.link.reports_sent,
                      "duplicates": client.link.duplicates}), flush=True)
    client.close()
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("srv") / "perseus.db", token=TOKEN).start()
    try:
        yield srv
    finally:
        srv.stop()


def http(srv: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30)


def new_job(srv: ServerProcess) -> str:
    with http(srv) as c:
        r = c.post(
            "/jobs",
            json={"stages": 1, "microbatches": 1, "schedule": "1f1b", "blocking_power": 50.0},
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def counters(srv: ServerProcess) -> tuple[float, float]:
    """(reports stored, reports dropped as duplicates) from /metrics."""
    with http(srv) as c:
        text = c.get("/metrics").text

    def value(name: str) -> float:
        m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("perseus_iteration_reports_total"), value("perseus_duplicate_reports_total")


def run_trainer(srv: ServerProcess, job: str, clock_shift_s: float) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            TRAINER,
            srv.grpc_target,
            job,
            str(clock_shift_s),
            TOKEN,
            str(ITERATIONS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_a_restart_with_the_clock_set_back_stores_every_report(server: ServerProcess) -> None:
    job = new_job(server)
    first = run_trainer(server, job, clock_shift_s=86_400.0)  # a host a day ahead
    assert first == {**first, "sent": ITERATIONS, "duplicates": 0}
    stored0, dup0 = counters(server)
    second = run_trainer(server, job, clock_shift_s=0.0)  # the rank restarts a day behind
    assert second["incarnation"] != first["incarnation"]
    assert second["sent"] == ITERATIONS and second["duplicates"] == 0
    stored1, dup1 = counters(server)
    assert stored1 - stored0 == ITERATIONS  # every new report stored
    assert dup1 == dup0


def test_a_report_with_the_largest_sequence_mutes_only_its_own_incarnation(
    server: ServerProcess,
) -> None:
    job = new_job(server)
    run_trainer(server, job, clock_shift_s=0.0)
    with http(server) as c:
        rank_id = c.get(f"/jobs/{job}/status").json()["ranks"][0]["rank_id"]
    top = 2**63 - 1
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = perseus_pb2_grpc.PlanServiceStub(channel)

        def report(sequence: int, incarnation: int) -> Any:
            msg = perseus_pb2.IterationReport(
                job_id=job,
                rank_id=rank_id,
                iteration=7,
                iteration_time=0.05,
                sequence=sequence,
                incarnation=incarnation,
            )
            return stub.ReportIterations(iter([msg]), metadata=server.grpc_metadata, timeout=30)

        ack = report(top, 42)
        assert (ack.accepted, ack.duplicates) == (1, 0)
        ack = report(top, 42)  # re-sent: a duplicate of incarnation 42
        assert (ack.accepted, ack.duplicates) == (1, 1)
        ack = report(5, 43)  # another incarnation: its own sequence space
        assert (ack.accepted, ack.duplicates) == (1, 0)
    stored0, dup0 = counters(server)
    again = run_trainer(server, job, clock_shift_s=0.0)
    assert again["duplicates"] == 0
    stored1, dup1 = counters(server)
    assert stored1 - stored0 == ITERATIONS and dup1 == dup0


def test_sequences_survive_a_server_restart_per_incarnation(tmp_path: Any) -> None:
    srv = ServerProcess(tmp_path / "perseus.db", token=TOKEN).start()
    try:
        job = new_job(srv)
        run_trainer(srv, job, clock_shift_s=0.0)
        with http(srv) as c:
            rank_id = c.get(f"/jobs/{job}/status").json()["ranks"][0]["rank_id"]
        msg = perseus_pb2.IterationReport(
            job_id=job,
            rank_id=rank_id,
            iteration=9,
            iteration_time=0.05,
            sequence=10,
            incarnation=77,
        )
        with grpc.insecure_channel(srv.grpc_target) as channel:
            stub = perseus_pb2_grpc.PlanServiceStub(channel)
            assert stub.ReportIterations(iter([msg]), metadata=srv.grpc_metadata).duplicates == 0
        srv.stop()
        srv.start()
        with grpc.insecure_channel(srv.grpc_target) as channel:
            stub = perseus_pb2_grpc.PlanServiceStub(channel)
            ack = stub.ReportIterations(iter([msg]), metadata=srv.grpc_metadata)
            assert (ack.accepted, ack.duplicates) == (1, 1)  # remembered across the restart
    finally:
        srv.stop()
