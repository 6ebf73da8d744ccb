"""Zeus's cost policy end to end.

A real server, real rank clients registering their GPUs' maximum power limit over gRPC,
``GET``/``PUT /jobs/{id}/plan?eta=...`` checked against a brute-force argmin over the frontier's
points, and the limit kept across a restart.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_client import PerseusClient, RankPosition, SimulatedGpu, read_profile_csv
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import problem_field, solved_job

pytestmark = pytest.mark.slow

MAX_POWER = 350.0  # what the simulated GPUs report (no known GPU has it: it must come from them)


def brute_force(points: list[dict[str, Any]], ranks: int, eta: float, max_power: float) -> int:
    costs = [eta * p["energy"] + (1 - eta) * max_power * ranks * p["time"] for p in points]
    return costs.index(min(costs))


def plan_index(http: httpx.Client, job: str, **query: Any) -> int:
    r = http.get(f"/jobs/{job}/plan", params=query)
    assert r.status_code == 200, r.text
    return int(r.json()["index"])


def test_eta_selects_the_least_cost_plan_with_the_ranks_max_power(
    tmp_path: Path, small_csv: str
) -> None:
    db = tmp_path / "perseus.db"
    with ServerProcess(db) as srv, httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        # gpu_model names no known GPU: before the ranks register, MAXPOWER is unknown
        job = solved_job(http, small_csv, gpu_model="")
        r = http.get(f"/jobs/{job}/plan", params={"eta": 0.5})
        assert r.status_code == 422 and problem_field(r) == "max_power", r.text
        assert "max_power" in r.json()["detail"]

        with grpc.insecure_channel(srv.grpc_target) as channel:
            stub = pb_grpc.PlanServiceStub(channel)
            for bad in (-1.0, math.nan, math.inf, 1e6):
                req = pb.RegisterRankRequest(job_id=job, max_power_limit_w=bad)
                with pytest.raises(grpc.RpcError) as e:
                    stub.RegisterRank(req, timeout=10)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "max_power_limit_w" in (e.value.details() or "")

        data = read_profile_csv(small_csv)
        clients = [
            PerseusClient(
                srv.grpc_target,
                job,
                gpu=SimulatedGpu(data, stage=rank, time_scale=0, max_power_limit_w=MAX_POWER),
                handle_signals=False,
                rank=RankPosition(global_rank=rank, pipeline_rank=rank),
            )
            for rank in (0, 1)
        ]
        try:
            for c in clients:
                assert c.link.wait_registered(30.0)
        finally:
            for c in clients:
                c.close()
        ranks = http.get(f"/jobs/{job}/status").json()["ranks"]
        assert [r["max_power_limit"] for r in ranks] == [MAX_POWER, MAX_POWER]

        frontier = http.get(f"/jobs/{job}/frontier").json()
        points = frontier["points"]
        assert len(points) == frontier["num_points"] > 3
        least_energy = min(range(len(points)), key=lambda i: points[i]["energy"])
        assert least_energy > 0  # the frontier trades time for energy
        picks = []
        for eta in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.97, 1.0):
            i = plan_index(http, job, eta=eta)
            assert i == brute_force(points, 2, eta, MAX_POWER), eta
            picks.append(i)
        assert picks[0] == 0 and picks[-1] == least_energy
        assert len(set(picks)) > 2
        # the request's max_power comes first
        for eta in (0.5, 0.9):
            assert plan_index(http, job, eta=eta, max_power=40.0) == brute_force(
                points, 2, eta, 40.0
            )

        for bad in (-0.1, 1.5, math.nan, "x"):
            r = http.get(f"/jobs/{job}/plan", params={"eta": bad})
            assert r.status_code == 422 and problem_field(r).split(".")[-1] == "eta", r.text
        r = http.put(f"/jobs/{job}/plan", json={"eta": 1.5})
        assert r.status_code == 422 and problem_field(r).split(".")[-1] == "eta", r.text

        r = http.put(f"/jobs/{job}/plan", json={"eta": 0.9})
        assert r.status_code == 200, r.text
        dep = r.json()
        assert dep["policy"] == {"kind": "eta", "value": 0.9, "max_power": MAX_POWER}
        expected = brute_force(points, 2, 0.9, MAX_POWER)
        assert [p["index"] for p in dep["pipelines"]] == [expected]
        assert "eta 0.9 (max power 350 W)" in dep["reason"] + dep["pipelines"][0]["reason"]

    # what the ranks registered, and the deployed policy, survive a restart
    with ServerProcess(db) as srv, httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
        ranks = http.get(f"/jobs/{job}/status").json()["ranks"]
        assert [r["max_power_limit"] for r in ranks] == [MAX_POWER, MAX_POWER]
        assert http.get(f"/jobs/{job}").json()["plan_version"] >= 1
        status = http.get(f"/jobs/{job}/status").json()
        assert status["plan"]["policy"] == {"kind": "eta", "value": 0.9, "max_power": MAX_POWER}
        assert plan_index(http, job, eta=0.3) == brute_force(points, 2, 0.3, MAX_POWER)


def test_a_known_gpu_model_supplies_max_power(tmp_path: Path, small_csv: str) -> None:
    """Without ranks, a job whose gpu_model is in the known-GPU table (A40: 300 W) has one."""
    with (
        ServerProcess(tmp_path / "perseus.db") as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        job = solved_job(http, small_csv, gpu_model="NVIDIA A40")
        points = http.get(f"/jobs/{job}/frontier").json()["points"]
        for eta in (0.2, 0.6, 0.95):
            assert plan_index(http, job, eta=eta) == brute_force(points, 2, eta, 300.0)
