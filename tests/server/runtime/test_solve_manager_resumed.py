"""Solves resumed by a new leader: two real ``perseus serve`` processes on a real PostgreSQL.

A solve the leader acknowledged (``POST /jobs/{id}/frontier`` answered 202) and did not finish
is finished by the standby that takes over, without the job asking again and without its rank
registering again: the rank's ``WatchPlan`` stream to the new leader receives the finished
frontier's plan. Two ways the leader goes: SIGKILL while the solve's first plan is deployed and
the rest is being computed (``partial``), and a clean stop (SIGTERM) while the solve still
waits for a worker (``queued``), which leaves the solve to the next leader instead of failing it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime.warmup import WARM_ENV
from perseus_server.testing.fault_hooks import TEST_SOLVE_DELAY_ENV, TEST_WARM_DELAY_ENV
from perseus_server.testing.postgres import PostgresServer

from ..conftest import make_job, register, wait_frontier
from ..postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)

LEASE = ["--leader-lease", "1.5"]


def _standby(srv: ServerProcess) -> threading.Thread:
    """Start ``srv`` as the standby (its start returns once it leads) on a thread."""
    t = threading.Thread(target=srv.start, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while "perseus: standby" not in srv.output():
        assert time.monotonic() < deadline, srv.output()
        time.sleep(0.05)
    return t


def _plans_until(target: str, job_id: str, rank_id: str, version: int) -> list[pb.PlanUpdate]:
    """The plans a rank's stream to ``target`` receives until one of at least ``version``."""
    got: list[pb.PlanUpdate] = []
    with grpc.insecure_channel(target) as ch:
        stream = pb_grpc.PlanServiceStub(ch).WatchPlan(
            pb.WatchPlanRequest(job_id=job_id, rank_id=rank_id), timeout=120
        )
        for msg in stream:
            got.append(msg)
            if msg.version >= version:
                break
        stream.cancel()
    return got


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["partial", "queued"])
def test_the_new_leader_finishes_a_solve_the_old_one_acknowledged(
    postgres: PostgresServer, tmp_path: Path, small_csv: str, phase: str
) -> None:
    url = database_for(postgres, tmp_path)
    # The old leader's solve stays unfinished: its partial phase, or its wait for the kernels'
    # warm-up, lasts ten minutes (test-only delays); the new leader has neither.
    held = (
        {TEST_SOLVE_DELAY_ENV: "600"}
        if phase == "partial"
        else {WARM_ENV: "1", TEST_WARM_DELAY_ENV: "600"}
    )
    old = ServerProcess(url, extra_args=LEASE, env=held)
    new = ServerProcess(url, extra_args=LEASE)
    try:
        old.start()
        with httpx.Client(base_url=old.http_url, timeout=30.0) as http:
            job_id = make_job(http)
            r = http.put(
                f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"}
            )
            assert r.status_code == 200, r.text
            with grpc.insecure_channel(old.grpc_target) as ch:
                rank_id = register(pb_grpc.PlanServiceStub(ch), job_id, 0, 0).rank_id
            assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
            st = wait_frontier(http, job_id, until=(phase,))
            assert st["status"] == phase
            before = http.get(f"/jobs/{job_id}").json()["plan_version"]
        assert before == (1 if phase == "partial" else 0)
        waiting = _standby(new)
        if phase == "partial":
            old.kill()
        else:
            old.stop()  # a clean stop hands the solve over instead of failing it
            assert "perseus: stopped" in old.output()
        waiting.join(120)
        assert "perseus: leader (epoch 2" in new.output(), new.output()

        plans = _plans_until(new.grpc_target, job_id, rank_id, before + 1)
        assert [p.version for p in plans] == sorted(p.version for p in plans)  # never back
        assert plans[-1].version == before + 1 and plans[-1].steps
        with httpx.Client(base_url=new.http_url, timeout=30.0) as http:
            st = wait_frontier(http, job_id)
            assert st["status"] == "done" and "partial" not in st, st
            assert st["num_points"] > 1
            job = http.get(f"/jobs/{job_id}").json()
            assert job["plan_version"] == before + 1
        assert "resuming the frontier computation" in new.output()
    finally:
        for srv in (old, new):
            srv.stop()
