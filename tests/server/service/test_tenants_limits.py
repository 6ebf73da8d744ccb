"""Fairness between tenants on a real ``perseus serve`` (issue #39): queues, quotas and rates.

One tenant's solve backlog never refuses another's solve (per-tenant queue shares, slots served in
turn); default quotas never over-commit the server's caps, so a tenant with nothing can always
create its first job; a tenant's stream cap is not multiplied by its jobs; a tenant's writes are
paced (429 with ``Retry-After``), the others' are not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import wait_frontier

ADMIN = "the-admin-token"
JOB = {"stages": 2, "microbatches": 4, "blocking_power": 70.0}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Server:
    """A server with an admin token; tenants made on it, each with a client."""

    def __init__(self, srv: ServerProcess) -> None:
        self.srv = srv
        self.admin = httpx.Client(base_url=srv.http_url, headers=_bearer(ADMIN), timeout=60)
        self.clients: list[httpx.Client] = []

    def tenant(self, name: str, **quotas: Any) -> httpx.Client:
        r = self.admin.post("/tenants", json={"id": name, **quotas})
        assert r.status_code == 201, r.text
        r = self.admin.post("/credentials", json={"scope": "tenant", "tenant": name})
        c = httpx.Client(
            base_url=self.srv.http_url, headers=_bearer(r.json()["credential"]), timeout=60
        )
        self.clients.append(c)
        return c

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.admin.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """``serve(*args)``: a server started with those options (stopped at the end)."""
    made: list[tuple[ServerProcess, Server]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Server:
        srv = ServerProcess(
            tmp_path / f"perseus-{len(made)}.db", token=ADMIN, extra_args=list(args), env=env
        ).start()
        made.append((srv, Server(srv)))
        return made[-1][1]

    yield start
    for srv, s in made:
        s.close()
        srv.stop()


# --- the solve queue ------------------------------------------------------------------------------


def _solve(http: httpx.Client, csv: str) -> str:
    r = http.post("/jobs", json=JOB)
    assert r.status_code == 201, r.text
    job = str(r.json()["id"])
    r = http.put(f"/jobs/{job}/profile", content=csv, headers={"content-type": "text/csv"})
    assert r.status_code == 200, r.text
    return job


def test_one_tenants_backlog_never_refuses_another_tenants_solve(
    serve: Any, small_csv: str
) -> None:
    s = serve(
        "--max-concurrent-solves", "1", "--max-queued-solves", "6",
        env={"PERSEUS_WARM_KERNELS": "0"},
    )  # fmt: skip
    ta, tb = s.tenant("team-a"), s.tenant("team-b")  # with default: 3 tenants, 2 waiting each
    b_jobs = [_solve(tb, small_csv) for _ in range(7)]
    a_job = _solve(ta, small_csv)
    got = []
    for k, job in enumerate(b_jobs):
        got.append(tb.post(f"/jobs/{job}/frontier").status_code)
        if k == 0:  # the first holds the one worker
            wait_frontier(tb, job, until=("running", "partial", "done"))
    # Team B: one running, its share of two waiting, the rest refused naming the share.
    assert got == [202, 202, 202, 409, 409, 409, 409], got
    r = tb.post(f"/jobs/{b_jobs[3]}/frontier")
    assert r.status_code == 409 and r.json()["field"] == "frontier", r.text
    assert "share of 2" in r.json()["detail"] and "3 tenant(s)" in r.json()["detail"], r.text
    # Team A's only solve is taken, and served before B's last waiting one.
    r = ta.post(f"/jobs/{a_job}/frontier")
    assert r.status_code == 202, r.text
    done = {job: wait_frontier(h, job) for h, job in [(ta, a_job)] + [(tb, j) for j in b_jobs[:3]]}
    assert all(d["status"] == "done" for d in done.values()), done
    finished = {job: d["finished"] for job, d in done.items()}
    assert finished[b_jobs[1]] < finished[a_job] < finished[b_jobs[2]], finished
    metrics = s.admin.get("/metrics").text
    assert 'perseus_refusals_total{reason="solve_queue",tenant="team-b"} 5' in metrics


# --- quotas ---------------------------------------------------------------------------------------


def test_default_quotas_never_over_commit_the_server(serve: Any) -> None:
    s = serve("--max-jobs", "12", "--max-gpus", "64")
    teams = [s.tenant(f"team-{k}") for k in range(5)]  # with default: 6 tenants
    listed = s.admin.get("/tenants").json()["tenants"]
    assert sum(t["max_jobs"] for t in listed) <= 12 and sum(t["max_gpus"] for t in listed) <= 64
    assert all(t["max_gpus"] is not None for t in listed)  # bounded by default
    # Four teams fill their quotas ...
    for team in teams[:4]:
        codes = [team.post("/jobs", json=JOB).status_code for _ in range(3)]
        assert codes == [201, 201, 409], codes
    # ... and the fifth, with nothing yet, still creates its first jobs.
    assert teams[4].post("/jobs", json=JOB).status_code == 201
    assert teams[4].post("/jobs", json=JOB).status_code == 201
    # A GPU quota by default: 64 GPUs over 6 tenants, 10 each.
    one = s.admin.get("/tenants/team-0").json()
    assert one["max_gpus"] == 10 and one["max_jobs"] == 2, one
    # A quota the caps cannot reserve is refused, and nothing changes.
    r = s.admin.patch("/tenants/team-0", json={"max_jobs": 8})
    assert r.status_code == 409 and r.json()["field"] == "max_jobs", r.text
    assert s.admin.get("/tenants/team-0").json()["max_jobs"] == 2
    r = s.admin.patch("/tenants/team-0", json={"max_gpus": 60})
    assert r.status_code == 409 and r.json()["field"] == "max_gpus", r.text


def test_a_default_gpu_quota_bounds_a_tenants_jobs(serve: Any) -> None:
    s = serve("--max-gpus", "64")
    team = s.tenant("team-a")  # with default: 32 each, at most a quarter (16)
    assert s.admin.get("/tenants/team-a").json()["max_gpus"] == 16
    r = team.post("/jobs", json={**JOB, "data_parallel": 9})  # 18 GPUs
    assert r.status_code == 409 and r.json()["field"] == "max_gpus", r.text
    assert team.post("/jobs", json={**JOB, "data_parallel": 8}).status_code == 201


# --- streams --------------------------------------------------------------------------------------


def _connected(admin: httpx.Client, job: str) -> int:
    return int(admin.get(f"/jobs/{job}/status").json()["connected_ranks"])


def _settled(admin: httpx.Client, job: str, call: Any, first: bool, g: int) -> bool:
    """Whether stream ``call`` (rank ``g``) is open (``first``: the first job) or refused."""
    if first:
        return _connected(admin, job) == g + 1
    return not call.is_active() or _connected(admin, job) > 0


def test_a_tenants_stream_cap_is_not_multiplied_by_its_jobs(serve: Any) -> None:
    s = serve("--max-streams-per-credential", "4")
    team = s.tenant("team-a")
    jobs = []
    for _ in range(3):
        r = team.post("/jobs", json={**JOB, "data_parallel": 2})  # 4 ranks each
        jobs.append((r.json()["id"], (("authorization", f"Bearer {r.json()['rank_credential']}"),)))
    calls = []
    with grpc.insecure_channel(s.srv.grpc_target) as ch:
        stub = pb_grpc.PlanServiceStub(ch)
        for k, (job, md) in enumerate(jobs):
            for g in range(4):
                req = pb.RegisterRankRequest(
                    job_id=job, global_rank=g, pipeline_rank=g % 2, data_rank=g // 2
                )
                rank = stub.RegisterRank(req, metadata=md, timeout=10).rank_id
                call = stub.WatchPlan(
                    pb.WatchPlanRequest(job_id=job, rank_id=rank), metadata=md, timeout=60
                )
                calls.append(call)
                deadline = time.monotonic() + 30
                while not _settled(s.admin, job, call, k == 0, g):
                    assert time.monotonic() < deadline, f"stream {k}/{g} neither open nor refused"
                    time.sleep(0.05)
        open_ = sum(_connected(s.admin, job) for job, _ in jobs)
        assert open_ == 4, f"{open_} streams open under a cap of 4"
        refused = [c for c in calls[4:] if not c.is_active()]
        assert len(refused) == 8
        with pytest.raises(grpc.RpcError) as info:
            next(refused[0])
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_streams_per_credential = 4" in str(info.value.details())
        for c in calls:
            c.cancel()


# --- the pace of a tenant's writes ----------------------------------------------------------------


def test_a_tenants_writes_are_paced_and_the_others_are_not(serve: Any) -> None:
    s = serve("--tenant-write-rate", "0.5", "--tenant-write-burst", "5")
    ta, tb = s.tenant("team-a"), s.tenant("team-b")
    mine = ta.post("/jobs", json=JOB).json()["id"]  # 1 of 5
    theirs = tb.post("/jobs", json=JOB).json()["id"]
    codes = [ta.post(f"/jobs/{mine}/finish").status_code]
    codes += [ta.delete(f"/jobs/{'0' * 16}").status_code for _ in range(3)]
    assert codes == [200, 404, 404, 404], codes
    # Over its burst: 429 with Retry-After, for its own, another's and an unknown id alike.
    refused = [
        ta.post("/jobs", json=JOB),
        ta.delete(f"/jobs/{theirs}"),
        ta.delete(f"/jobs/{'0' * 16}"),
    ]
    for r in refused:
        assert r.status_code == 429 and r.json()["field"] == "tenant", r.text
        assert int(r.headers["Retry-After"]) >= 1
    assert refused[1].json()["detail"] == refused[2].json()["detail"]
    # Its reads go on, and so do another tenant's writes.
    assert ta.get(f"/jobs/{mine}").status_code == 200
    assert tb.post("/jobs", json=JOB).status_code == 201
    metrics = s.admin.get("/metrics").text
    assert 'perseus_refusals_total{reason="rate_limited",tenant="team-a"} 3' in metrics
    assert 'reason="rate_limited",tenant="team-b"' not in metrics
    time.sleep(2.1)  # one write back
    assert ta.post(f"/jobs/{mine}/finish").status_code == 409  # finished already: served
