"""Real responses of a real server, through a job's whole life, validated against its schema.

The schema is the one the server publishes at ``/openapi.json``; every documented success response
is exercised.

Variants covered: job views before a profile, with one, solving, ready, failed (cancelled) and
with custom and interleaved schedules; the frontier before, during and after a solve, with and
without points, stale; plans by deadline, slowdown, energy budget and index (with steps);
deployments of every kind (plan, profiling step, max clocks); stragglers reported and
detected, a slow stage re-solved; online profiling started, in progress and aborted; the
problem documents of 404, 409, 413 and 422. And the partial frontier (a solve's first plan,
deployed while the rest is computed, on a server whose solves are slowed for it): the job,
its frontier, status, plan queries and a deployment during that phase, then after it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from perseus.profiles import parse_profile_csv
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.testing.fault_hooks import TEST_SOLVE_DELAY_ENV

from ..conftest import A40, BLOCKING_A40, register, register_all
from ..service.test_power_budget import exercise_power_budget
from .test_credentials import exercise_credentials
from .test_docs_openapi import Contract
from .test_tenants import exercise_tenants

pytestmark = pytest.mark.slow

JOB = "/jobs/{job_id}"


def _job(c: Contract, **overrides: Any) -> str:
    body = {"stages": 2, "microbatches": 4, "blocking_power": BLOCKING_A40, "gpu_model": "A40"}
    return str(c.call("POST", "/jobs", 201, json={**body, **overrides}).json()["id"])


def _until(
    c: Contract, template: str, job_id: str, pred: Callable[[dict[str, Any]], bool], **kw: Any
) -> dict[str, Any]:
    """Poll ``GET template`` (each answer checked) until ``pred`` holds."""
    deadline = time.monotonic() + 120
    while True:
        body = dict(c.call("GET", template, 200, path={"job_id": job_id}, **kw).json())
        if pred(body):
            return body
        assert time.monotonic() < deadline, f"not reached: {body}"
        time.sleep(0.05)


def _solve(c: Contract, job_id: str) -> dict[str, Any]:
    c.call("POST", JOB + "/frontier", 202, path={"job_id": job_id})
    return _until(c, JOB + "/frontier", job_id, lambda b: b["status"] in ("done", "failed"))


def _measurements(
    profile: Any, stage: int, freq: int, factor: float = 1.0
) -> list[pb.InstructionMeasurement]:
    out = []
    for kind in ("forward", "backward"):
        entry = profile[(stage, kind)]
        i = list(entry.frequencies).index(freq)
        out += [
            pb.InstructionMeasurement(
                instruction=kind,
                microbatch=m,
                frequency_mhz=freq,
                time=float(entry.times[i]) * factor,
                energy=float(entry.energies[i]),
                stage=stage,
            )
            for m in range(4)
        ]
    return out


def _errors(c: Contract, small_csv: str) -> None:
    c.call("GET", JOB, 404, path={"job_id": "nope"})
    c.call("DELETE", JOB, 404, path={"job_id": "nope"})
    c.call("GET", JOB + "/status", 404, path={"job_id": "nope"})
    body = c.call("POST", "/jobs", 422, json={"stages": 0, "microbatches": "x"}).json()
    assert len(body["errors"]) == 2
    c.call("POST", "/jobs", 422, content=b"{not json", headers={"content-type": "application/json"})
    job_id = _job(c)
    c.call("GET", JOB + "/profile", 404, path={"job_id": job_id})
    c.call("POST", JOB + "/frontier", 409, path={"job_id": job_id})
    c.call("GET", JOB + "/plan", 409, path={"job_id": job_id}, params={"slowdown": 0.1})
    c.call("GET", JOB + "/frontier.png", 409, path={"job_id": job_id})
    c.call("GET", JOB + "/profiling", 404, path={"job_id": job_id})
    lines = small_csv.splitlines()
    lines[3] = ",".join([*lines[3].split(",")[:3], "-1", "5"])  # a negative time on line 4
    bad = "\n".join(lines) + "\n"
    body = c.call(
        "PUT", JOB + "/profile", 422, path={"job_id": job_id}, content=bad,
        headers={"content-type": "text/csv"},
    ).json()  # fmt: skip
    assert body["field"].startswith("profile") and body["row"] == 4
    body = c.call(
        "PUT", JOB + "/straggler-detection", 413, path={"job_id": job_id},
        content=b" " * (4 * 1024 * 1024 + 1), headers={"content-type": "application/json"},
    ).json()  # fmt: skip
    assert body["limit"] == 4 * 1024 * 1024
    c.call("GET", JOB + "/profile", 422, path={"job_id": job_id}, params={"format": "xml"})


def _main_job(c: Contract, small_csv: str) -> str:
    """A dp=2 job from creation to a deployed plan, with every plan query and deployment."""
    job_id = _job(c, data_parallel=2)
    p = {"job_id": job_id}
    assert c.call("GET", JOB, 200, path=p).json()["profile"] is None
    st = c.call("GET", JOB + "/frontier", 200, path=p).json()
    assert st["status"] == "none" and "points" not in st and "num_points" not in st
    csv = {"content": small_csv, "headers": {"content-type": "text/csv"}}
    c.call("PUT", JOB + "/profile", 200, path=p, **csv)
    assert c.call("GET", JOB, 200, path=p).json()["state"] == "profiled"
    c.call("GET", JOB + "/status", 200, path=p)
    c.call("GET", JOB + "/profile", 200, path=p)
    as_json = c.call("GET", JOB + "/profile", 200, path=p, params={"format": "json"}).json()
    c.call("PUT", JOB + "/profile", 200, path=p, json=as_json)
    assert c.call("POST", JOB + "/frontier", 202, path=p).json()["status"] == "queued"
    c.call("POST", JOB + "/frontier", 409, path=p)
    c.call("GET", JOB + "/status", 200, path=p)
    st = _until(c, JOB + "/frontier", job_id, lambda b: b["status"] == "done")
    assert st["num_points"] == len(st["points"]) >= 2
    c.call("GET", JOB + "/frontier", 200, path=p, params={"points": False})
    c.call("GET", JOB + "/frontier.png", 200, path=p)
    assert c.call("GET", JOB, 200, path=p).json()["state"] == "ready"

    mid = st["points"][len(st["points"]) // 2]
    for params in (
        {"slowdown": 0.05},
        {"deadline": mid["time"]},
        {"energy_budget": mid["energy"]},
        {"index": 1, "steps": True},
    ):
        c.call("GET", JOB + "/plan", 200, path=p, params=params)
    assert (
        "steps" in c.call("GET", JOB + "/plan", 200, path=p, params={"index": 0, "steps": 1}).json()
    )
    c.call("GET", JOB + "/plan", 422, path=p, params={"deadline": 1e-9})
    c.call("GET", JOB + "/plan", 422, path=p, params={"deadline": "soon"})
    dep = c.call("PUT", JOB + "/plan", 200, path=p, json={"slowdown": 0.1}).json()
    assert dep["kind"] == "plan" and len(dep["pipelines"]) == 2
    c.call("PUT", JOB + "/plan", 200, path=p, json={"index": 1, "pipelines": [1]})
    c.call("PUT", JOB + "/plan", 422, path=p, json={"index": 1, "pipelines": [5]})
    c.call("PUT", JOB + "/plan", 200, path=p, json={})
    c.call("PUT", JOB + "/straggler-detection", 200, path=p, json={"threshold": 0.05})
    c.call("PUT", JOB + "/straggler-detection", 422, path=p, json={"recovery": 0.5})
    return job_id


def _stragglers(c: Contract, stub: pb_grpc.PlanServiceStub, job_id: str, small_csv: str) -> None:
    """Reported and detected stragglers, a slow stage re-solved, ranks connected."""
    p = {"job_id": job_id}
    st = c.call("POST", JOB + "/stragglers", 200, path=p, json={"pipeline": 1, "slowdown": 0.2})
    assert st.json()["pipelines"][1]["straggler"]["source"] == "reported"
    c.call("POST", JOB + "/stragglers", 200, path=p, json={"pipeline": 0, "iteration_time": 9.0})
    c.call("DELETE", JOB + "/stragglers", 404, path=p, params={"pipeline": 1_000})
    c.call("DELETE", JOB + "/stragglers", 200, path=p, params={"pipeline": 1})
    c.call("DELETE", JOB + "/stragglers", 200, path=p)

    profile = parse_profile_csv(small_csv)
    freq = max(profile.frequencies)
    ids = {(d, s): register(stub, job_id, d * 2 + s, s, data_rank=d).rank_id for d in (0, 1) for s in (0, 1)}  # fmt: skip
    stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job_id, rank_id=ids[(0, 0)]), timeout=60)
    next(stream)
    st = _until(c, JOB + "/status", job_id, lambda b: b["connected_ranks"] == 1)
    version = st["plan"]["version"]
    t_plan = st["plan"]["pipelines"][1]["time"]
    iteration = iter(range(10_000))

    def report(factors: dict[tuple[int, int], float], times: dict[int, float], v: int) -> None:
        reps = []
        for (d, s), rank_id in ids.items():
            k = factors.get((d, s))
            reps.append(
                pb.IterationReport(
                    job_id=job_id, rank_id=rank_id, iteration=next(iteration),
                    iteration_time=times.get(d, t_plan), plan_version=v, energy=50.0,
                    instructions=_measurements(profile, s, freq, k) if k else [],
                )
            )  # fmt: skip
        stub.ReportIterations(iter(reps), timeout=10)

    for _ in range(3):  # pipeline 1 runs 25 % slow: a detected straggler
        report({}, {1: t_plan * 1.25}, version)
    st = c.call("GET", JOB + "/status", 200, path=p).json()
    assert st["pipelines"][1]["straggler"]["source"] == "detected"
    assert st["measured"]["iterations"] == 3 and st["measured"]["average_power"] > 0
    assert st["ranks"][0]["last_iteration"] is not None and st["pipelines"][1]["recent_iterations"]
    c.call("DELETE", JOB + "/stragglers", 200, path=p)

    version = c.call("GET", JOB + "/status", 200, path=p).json()["plan"]["version"]
    slow = {(1, 0): 1.0, (1, 1): 1.3, (0, 0): 1.0, (0, 1): 1.0}
    for _ in range(3):  # stage 1 of pipeline 1 runs 30 % slow: its frontier is re-solved
        report(slow, {}, version)
    st = _until(
        c, JOB + "/status", job_id,
        lambda b: (b["pipelines"][1]["slow_stages"] or {}).get("status") == "ready"
        and b["plan"]["version"] > version,
    )  # fmt: skip
    assert st["plan"]["pipelines"][1]["frontier"] != "job"
    c.call("DELETE", JOB + "/stragglers", 200, path=p, params={"pipeline": 1})
    stream.cancel()


def _profiling(c: Contract, stub: pb_grpc.PlanServiceStub, small_freqs: list[int]) -> None:
    """A scan started, measured at one clock, part-way through the next, then aborted."""
    job_id = _job(c)
    p = {"job_id": job_id}
    c.call("POST", JOB + "/profiling", 409, path=p, json={})  # no ranks: no clocks to scan
    ids = [register(stub, job_id, s, s, clocks=small_freqs).rank_id for s in (0, 1)]
    c.call("POST", JOB + "/profiling", 422, path=p, json={"iterations_per_frequency": 0})
    body = {"frequencies": small_freqs[:3], "warmup_iterations": 0, "iterations_per_frequency": 2}
    st = c.call("POST", JOB + "/profiling", 202, path=p, json=body).json()
    assert st["current_frequency"] == small_freqs[0]
    c.call("POST", JOB + "/profiling", 409, path=p, json=body)
    c.call("PUT", JOB + "/profile", 409, path=p, content="x", headers={"content-type": "text/csv"})
    assert c.call("GET", JOB + "/status", 200, path=p).json()["plan"]["kind"] == "profiling"

    def report(ranks: list[int], n: int) -> None:
        prog = c.call("GET", JOB + "/profiling", 200, path=p).json()
        f, v = prog["current_frequency"], prog["plan_version"]
        reps = [
            pb.IterationReport(
                job_id=job_id, rank_id=ids[s], iteration=i, iteration_time=1.0, plan_version=v,
                energy=10.0, instructions=[
                    pb.InstructionMeasurement(instruction=k, microbatch=m, frequency_mhz=f,
                                              time=0.01, energy=1.0, stage=s)
                    for k in ("forward", "backward") for m in range(4)
                ],
            )
            for s in ranks for i in range(n)
        ]  # fmt: skip
        stub.ReportIterations(iter(reps), timeout=10)

    report([0, 1], 2)  # the first clock measured: the scan moves on
    report([0], 1)  # part of the second
    prog = c.call("GET", JOB + "/profiling", 200, path=p).json()
    assert prog["step"] == 1 and len(prog["energy_per_iteration"]) == 1
    assert prog["measured_iterations"] == {ids[0]: 1}
    st = c.call("GET", JOB + "/status", 200, path=p).json()
    assert st["profiling"]["status"] == "running" and st["state"] == "profiling"
    c.call("GET", JOB, 200, path=p)
    assert c.call("DELETE", JOB + "/profiling", 200, path=p).json()["status"] == "aborted"
    c.call("DELETE", JOB + "/profiling", 409, path=p)
    st = c.call("GET", JOB + "/status", 200, path=p).json()
    assert st["plan"]["kind"] == "max_clock" and st["profiling"]["current_frequency"] is None


def _cancelled(c: Contract) -> None:
    """A long computation cancelled: the job and its frontier in state failed."""
    job_id = _job(c, stages=8, microbatches=64)
    p = {"job_id": job_id}
    c.call("PUT", JOB + "/profile", 200, path=p, content=A40.read_text(),
           headers={"content-type": "text/csv"})  # fmt: skip
    c.call("POST", JOB + "/frontier", 202, path=p)
    st = c.call("DELETE", JOB + "/frontier", 202, path=p).json()
    st = _until(c, JOB + "/frontier", job_id, lambda b: b["status"] == "failed")
    assert "cancel" in st["error"]
    assert c.call("GET", JOB, 200, path=p).json()["state"] == "failed"
    c.call("DELETE", JOB + "/frontier", 409, path=p)


def test_real_responses_match_the_published_schema(
    http: httpx.Client,
    stub: pb_grpc.PlanServiceStub,
    small_csv: str,
    small_freqs: list[int],
) -> None:
    c = Contract(http)
    c.call("GET", "/healthz", 200)
    _errors(c, small_csv)
    job_id = _main_job(c, small_csv)
    register_all(stub, job_id, 2, 2)  # every rank connected: it draws on a power budget
    exercise_power_budget(c, job_id)
    exercise_credentials(c, job_id)
    exercise_tenants(c)
    _stragglers(c, stub, job_id, small_csv)
    _profiling(c, stub, small_freqs)
    _cancelled(c)
    _job(c, schedule={"name": "interleaved-1f1b", "virtual_stages": 2})
    orders = [[["forward", 0, s], ["backward", 0, s]] for s in (0, 1)]
    _job(c, microbatches=1, schedule={"name": "custom", "orders": orders})
    stale = _job(c)
    csv = {"content": small_csv, "headers": {"content-type": "text/csv"}}
    c.call("PUT", JOB + "/profile", 200, path={"job_id": stale}, **csv)
    assert _solve(c, stale)["stale"] is False
    c.call("PUT", JOB + "/profile", 200, path={"job_id": stale}, **csv)
    assert c.call("GET", JOB + "/frontier", 200, path={"job_id": stale}).json()["stale"] is True
    jobs = c.call("GET", "/jobs", 200).json()["jobs"]
    assert {j["state"] for j in jobs} >= {"created", "ready", "failed"}
    c.call("GET", "/metrics", 200)
    assert c.call("POST", JOB + "/finish", 200, path={"job_id": stale}).json()["state"] == (
        "finished"
    )
    c.call("POST", JOB + "/finish", 409, path={"job_id": stale})
    c.call("DELETE", JOB, 204, path={"job_id": stale})

    missing = c.documented_successes() - c.seen
    assert not missing, f"documented responses never exercised: {sorted(missing)}"
    errors = {status for _, _, status, _ in c.seen if status >= 400}
    assert errors >= {404, 409, 413, 422}


def test_partial_frontier_responses_match_the_published_schema(
    tmp_path: Path, small_csv: str
) -> None:
    env = {TEST_SOLVE_DELAY_ENV: "4"}
    with (
        ServerProcess(tmp_path / "perseus.db", env=env) as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        c = Contract(http)
        job_id = _job(c, data_parallel=2)
        p = {"job_id": job_id}
        c.call("PUT", JOB + "/profile", 200, path=p, content=small_csv,
               headers={"content-type": "text/csv"})  # fmt: skip
        c.call("POST", JOB + "/frontier", 202, path=p)
        st = _until(c, JOB + "/frontier", job_id, lambda b: b["status"] == "partial")
        assert st["partial"] is True and len(st["points"]) == 1
        assert c.call("GET", JOB, 200, path=p).json()["frontier_status"] == "partial"
        status = c.call("GET", JOB + "/status", 200, path=p).json()
        assert status["frontier"]["partial"] is True and status["plan"]["partial"] is True
        c.call("GET", JOB + "/frontier", 200, path=p, params={"points": False})
        for params in ({"index": 0, "steps": True}, {"slowdown": 0.05}):
            assert c.call("GET", JOB + "/plan", 200, path=p, params=params).json()["partial"]
        assert c.call("PUT", JOB + "/plan", 200, path=p, json={}).json()["partial"] is True
        c.call("GET", JOB + "/frontier.png", 200, path=p)
        st = _until(c, JOB + "/frontier", job_id, lambda b: b["status"] == "done")
        assert "partial" not in st and len(st["points"]) >= 2
        assert "partial" not in c.call("GET", JOB + "/status", 200, path=p).json()["plan"]
        health = c.call("GET", "/healthz", 200).json()
        # The suite's servers skip the warm-up (tests/conftest.py) unless a test asks for it.
        warming = os.environ.get("PERSEUS_WARM_KERNELS", "1") != "0"
        assert health["kernels"] in (("warming", "ready") if warming else ("skipped",))
