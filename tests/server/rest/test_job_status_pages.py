"""A status costs the page, not the job.

At most ``?ranks=`` ranks' detail (64 unless asked), ``ranks_next`` to go on; registrations carry
bounded clocks and names; the status benchmark's smoke mode runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server.domain.bounds import MAX_GPU_NAME, MAX_HOSTNAME, MAX_SUPPORTED_CLOCKS

from ..conftest import make_job, register

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def big_job(http: httpx.Client, stub: pb_grpc.PlanServiceStub) -> str:
    job = make_job(http, data_parallel=40)  # 80 ranks
    for g in range(80):
        register(stub, job, g, g % 2, data_rank=g // 2)
    return job


def _status(http: httpx.Client, job: str, **params: Any) -> dict[str, Any]:
    r = http.get(f"/jobs/{job}/status", params=params)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_status_lists_a_page_of_ranks(http: httpx.Client, big_job: str) -> None:
    st = _status(http, big_job)
    assert st["registered_ranks"] == 80 and st["expected_ranks"] == 80
    assert [r["global_rank"] for r in st["ranks"]] == list(range(64))
    assert st["ranks_next"] == 63
    rest = _status(http, big_job, after=st["ranks_next"])
    assert [r["global_rank"] for r in rest["ranks"]] == list(range(64, 80))
    assert rest["ranks_next"] is None
    pages, after = [], None
    while True:
        page = _status(http, big_job, ranks=30, **({} if after is None else {"after": after}))
        pages.append([r["global_rank"] for r in page["ranks"]])
        after = page["ranks_next"]
        if after is None:
            break
    assert pages == [list(range(0, 30)), list(range(30, 60)), list(range(60, 80))]
    summary = _status(http, big_job, ranks=0)
    assert summary["ranks"] == [] and summary["registered_ranks"] == 80
    for bad in ({"ranks": 1025}, {"ranks": -1}, {"after": "x"}):
        assert http.get(f"/jobs/{big_job}/status", params=bad).status_code == 422


def test_status_paging_is_in_the_openapi(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    op = spec["paths"]["/jobs/{job_id}/status"]["get"]
    assert {p["name"] for p in op["parameters"]} >= {"job_id", "ranks", "after"}
    assert "ranks_next" in spec["components"]["schemas"]["JobStatus"]["properties"]


def test_a_registration_carries_bounded_clocks_and_names(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub
) -> None:
    job = make_job(http)
    too_much = {
        "supported_clocks_mhz": {"supported_clocks_mhz": list(range(1, MAX_SUPPORTED_CLOCKS + 2))},
        "gpu_name": {"gpu_name": "g" * (MAX_GPU_NAME + 1)},
        "hostname": {"hostname": "h" * (MAX_HOSTNAME + 1)},
    }
    for field, extra in too_much.items():
        req = pb.RegisterRankRequest(job_id=job, global_rank=0, pipeline_rank=0, **extra)
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterRank(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith(field + ":"), e.value.details()
    ok = pb.RegisterRankRequest(
        job_id=job, global_rank=0, pipeline_rank=0, gpu_name="g" * MAX_GPU_NAME,
        hostname="h" * MAX_HOSTNAME, supported_clocks_mhz=list(range(1, MAX_SUPPORTED_CLOCKS + 1)),
    )  # fmt: skip
    assert stub.RegisterRank(ok, timeout=10).rank_id  # the largest allowed


@pytest.mark.slow
def test_the_status_benchmark_smoke_mode_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "server.py"), "--status-load", "1", "--smoke"],
        capture_output=True, text=True, timeout=600, env=os.environ.copy(), cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = out.stdout
    assert "GET status at 64 ranks (default document)" in rows
    assert "every rank's detail" in rows and "64 ranks" in rows
    assert "/healthz while 2 clients poll that status" in rows and "0 failed" in rows
