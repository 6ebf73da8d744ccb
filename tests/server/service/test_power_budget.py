"""Power budgets on a real server.

Plan powers, the per-job query against brute force over the frontier, the cluster budget (optimal on
small instances, never over budget, recomputed on job add/delete and straggler changes, pushed to
real gRPC streams), bad budgets, and a restart.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from perseus.problem import EnergyProblem
from perseus.profiles import parse_profile_csv
from perseus.schedules import make_schedule
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import BLOCKING_A40, problem_field, register, register_all, solved_job


def _points(http: httpx.Client, job: str) -> list[dict[str, Any]]:
    return list(http.get(f"/jobs/{job}/frontier").json()["points"])


def _fastest_within(points: list[dict[str, Any]], watts: float) -> int | None:
    """Brute force: the fastest point whose average power is within ``watts``.

    Ties: least energy.
    """
    ok = [p for p in points if p["average_power"] <= watts * (1 + 1e-12)]
    if not ok:
        return None
    return min(ok, key=lambda p: (p["time"], p["energy"]))["index"]


@pytest.fixture(scope="module")
def two_pipelines(http: httpx.Client, small_csv: str) -> str:
    return solved_job(http, small_csv, data_parallel=2, tensor_parallel=2)


def test_plan_power_is_energy_over_time_for_the_whole_job(
    http: httpx.Client, small_csv: str, two_pipelines: str
) -> None:
    job = two_pipelines
    points = _points(http, job)
    problem = EnergyProblem.build(
        parse_profile_csv(small_csv), make_schedule("1f1b", 2, 4), BLOCKING_A40
    )
    power = problem.energies / problem.times
    for p in points[:: max(1, len(points) // 7)]:
        plan = http.get(f"/jobs/{job}/plan", params={"index": p["index"]}).json()
        # re-evaluate the plan from the profile: E / T times the job's 2 x 2 copies
        freqs = np.array([f for rank in plan["frequencies"] for f in rank])
        ev = problem.evaluate(_options(problem, plan["frequencies"]))
        assert plan["average_power"] == pytest.approx(4 * ev.energy / ev.time, rel=1e-9)
        assert p["average_power"] == pytest.approx(plan["average_power"], rel=1e-12)
        assert freqs.size == problem.num_nodes
        opts = _options(problem, plan["frequencies"])
        peak = max(power[i, k] for i, k in enumerate(opts))
        assert plan["peak_power"] == pytest.approx(peak, rel=1e-12) == p["peak_power"]
    st = http.get(f"/jobs/{job}/status").json()["plan"]
    assert st["average_power"] == pytest.approx(points[0]["average_power"])
    assert st["peak_power"] == pytest.approx(points[0]["peak_power"])
    assert [q["average_power"] for q in st["pipelines"]] == pytest.approx(
        [points[0]["average_power"] / 2] * 2
    )
    assert st["constraint"] == "own policy"


def _options(problem: EnergyProblem, frequencies: list[list[int]]) -> np.ndarray:
    """Per DAG node, the option index of its frequency in the plan (ranks' orders in DAG order)."""
    flat = [f for rank in frequencies for f in rank]
    return np.array(
        [int(np.flatnonzero(problem.freqs[i] == f)[0]) for i, f in enumerate(flat)], dtype=np.uint8
    )


def test_per_job_power_budget_is_the_fastest_plan_within_it(
    http: httpx.Client, two_pipelines: str
) -> None:
    job = two_pipelines
    points = _points(http, job)
    powers = sorted({p["average_power"] for p in points})
    budgets = [powers[0], powers[-1], powers[-1] * 2, *np.linspace(powers[0], powers[-1], 9)]
    budgets += [(a + b) / 2 for a, b in itertools.pairwise(powers[:: max(1, len(powers) // 6)])]
    for w in budgets:
        got = http.get(f"/jobs/{job}/plan", params={"power_budget": w}).json()
        assert got["index"] == _fastest_within(points, w), w
        assert got["average_power"] <= w * (1 + 1e-12)
    # below the lowest: 422 naming the field and the lowest achievable power
    r = http.get(f"/jobs/{job}/plan", params={"power_budget": powers[0] * 0.99})
    assert r.status_code == 422 and problem_field(r) == "power_budget"
    assert r.json()["lowest_power"] == pytest.approx(powers[0])
    for bad in ("nan", "-5", "0", "inf", "watts"):
        r = http.get(f"/jobs/{job}/plan", params={"power_budget": bad})
        assert r.status_code == 422 and problem_field(r) == "power_budget", bad
    r = http.get(f"/jobs/{job}/plan", params={"power_budget": 1e4, "deadline": 10})
    assert r.status_code == 422

    # PUT /plan deploys it; a budget nothing meets changes nothing
    w = (powers[len(powers) // 2] + powers[len(powers) // 2 + 1]) / 2
    dep = http.put(f"/jobs/{job}/plan", json={"power_budget": w}).json()
    want = _fastest_within(points, w)
    assert [p["index"] for p in dep["pipelines"]] == [want, want]
    assert dep["policy"] == {"kind": "power_budget", "value": w, "copies": 4}
    assert dep["average_power"] <= w and "power budget" in dep["reason"]
    for bad in (powers[0] / 2, -1.0, 0.0):
        r = http.put(f"/jobs/{job}/plan", json={"power_budget": bad})
        assert r.status_code == 422 and problem_field(r) == "power_budget"
    r = http.put(f"/jobs/{job}/plan", content=b'{"power_budget": NaN}',
                 headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 422
    st = http.get(f"/jobs/{job}/status").json()["plan"]
    assert st["version"] == dep["version"] and st["policy"]["kind"] == "power_budget"
    http.put(f"/jobs/{job}/plan", json={})


def _brute_force(jobs: list[dict[str, Any]], watts: float, policy: str) -> float:
    """The best objective over every combination of points (slowdowns at own time)."""
    best = math.inf
    choices = [[(p["average_power"], p["time"] / j["t0"] - 1) for p in j["points"]] for j in jobs]
    for combo in itertools.product(*choices):
        if math.fsum(c[0] for c in combo) > watts:
            continue
        if policy == "throughput":
            value = math.fsum(j["gpus"] * c[1] for j, c in zip(jobs, combo, strict=True))
        else:
            value = max(c[1] for c in combo)
        best = min(best, value)
    return best


def _until(http: httpx.Client, ok: Any, timeout: float = 10.0) -> dict[str, Any]:
    """The power budget's view once ``ok(view)`` (changes jobs make are merged over 0.5 s)."""
    deadline = time.monotonic() + timeout
    while not ok(body := http.get("/power-budget").json()):
        assert time.monotonic() < deadline, body
        time.sleep(0.05)
    return dict(body)


def _deployed(http: httpx.Client, job: str) -> list[int]:
    return [p["index"] for p in http.get(f"/jobs/{job}/status").json()["plan"]["pipelines"]]


def test_cluster_budget_is_optimal_never_over_and_follows_the_jobs(
    tmp_path: Path, small_csv: str
) -> None:
    with (
        ServerProcess(tmp_path / "perseus.db") as srv,
        httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=60.0) as http,
    ):
        a = solved_job(http, small_csv)
        b = solved_job(http, small_csv, data_parallel=2)
        pa, pb_ = _points(http, a), _points(http, b)
        lowest = min(p["average_power"] for p in pa) + min(p["average_power"] for p in pb_)
        highest = pa[0]["average_power"] + pb_[0]["average_power"]

        # real ranks of job a stream their plans; b's rank registers (a job draws on the
        # budget once its training started, never from its creation alone)
        channel = grpc.insecure_channel(srv.grpc_target)
        stub = pb_grpc.PlanServiceStub(channel)
        rank = register(stub, a, 0, 0).rank_id
        register(stub, a, 1, 1)
        register_all(stub, b, 2, 2)  # a pipeline draws once all its ranks are registered
        stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=a, rank_id=rank), timeout=60)
        first = next(stream)

        jobs = [
            {"points": pa, "t0": pa[0]["time"], "gpus": 2},
            {"points": pb_, "t0": pb_[0]["time"], "gpus": 4},
        ]
        for frac in (0.5, 0.8, 0.95):
            w = lowest + frac * (highest - lowest)
            for policy in ("throughput", "fair"):
                r = http.put("/power-budget", json={"watts": w, "policy": policy})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["feasible"] and body["allocated_watts"] <= w
                assert body["policy"] == policy and body["covers"] is None
                got = {j["id"]: j for j in body["jobs"]}
                slow = [got[a]["slowdown"], got[b]["slowdown"]]
                value = 2 * slow[0] + 4 * slow[1] if policy == "throughput" else max(slow)
                assert value == pytest.approx(_brute_force(jobs, w, policy), abs=1e-12)
                assert _deployed(http, a) == [got[a]["point"]]
                assert _deployed(http, b) == [got[b]["point"]] * 2
                st = http.get(f"/jobs/{b}/status").json()
                assert st["plan"]["constraint"] == "power budget"
                assert "cluster power budget" in st["plan"]["reason"]
                assert st["power_budget"]["watts"] == pytest.approx(got[b]["watts"])
        # the rank received the budget's plan over its stream
        update = first
        while update.version < http.get(f"/jobs/{a}").json()["plan_version"]:
            update = next(stream)
        assert "cluster power budget" in update.reason
        assert update.expected_iteration_time == pytest.approx(pa[got[a]["point"]]["time"])

        # a straggler in b: b cannot be faster than T'; its freed power goes to a
        w = lowest + 0.5 * (highest - lowest)
        before = http.put("/power-budget", json={"watts": w}).json()
        r = http.post(f"/jobs/{b}/stragglers", json={"pipeline": 1, "slowdown": 0.25})
        assert r.status_code == 200
        after = http.get("/power-budget").json()
        assert after["allocated_watts"] <= w
        share = {j["id"]: j for j in after["jobs"]}
        old = {j["id"]: j for j in before["jobs"]}
        assert share[a]["slowdown"] <= old[a]["slowdown"]
        assert share[a]["point"] <= old[a]["point"]
        assert share[b]["watts"] < old[b]["watts"] or share[b]["point"] != old[b]["point"]
        st = http.get(f"/jobs/{b}/status").json()["plan"]
        assert st["constraint"] == "power budget and straggler"
        http.delete(f"/jobs/{b}/stragglers")
        assert _until(http, lambda b: b == before) == before  # merged: within half a second

        # a job solved later joins the budget; deleting it hands its power back
        low_a = min(p["average_power"] for p in pa)
        w3 = lowest + low_a + 0.3 * (highest - lowest)
        before = http.put("/power-budget", json={"watts": w3}).json()
        c = solved_job(http, small_csv)
        assert c not in {j["id"] for j in http.get("/power-budget").json()["jobs"]}  # not started
        register(stub, c, 0, 0)
        assert c not in {j["id"] for j in http.get("/power-budget").json()["jobs"]}  # 1 of 2
        register(stub, c, 1, 1)
        body = _until(http, lambda b: len(b["jobs"]) == 3)
        assert {j["id"] for j in body["jobs"]} == {a, b, c}
        assert body["allocated_watts"] <= w3 and body["feasible"]
        assert {j["id"]: j["point"] for j in body["jobs"]}[c] == _deployed(http, c)[0]
        assert sum(j["watts"] for j in body["jobs"] if j["id"] != c) < before["allocated_watts"]
        http.delete(f"/jobs/{c}")
        assert _until(http, lambda b: b == before) == before  # merged: within half a second
        # a job that makes the budget unreachable: kept, feasible false, every job at least power
        before = http.put("/power-budget", json={"watts": w}).json()
        c = solved_job(http, small_csv)
        time.sleep(0.6)  # the last recomputation a job caused is half a second old
        register_all(stub, c, 2)
        body = http.get("/power-budget").json()
        assert not body["feasible"] and body["lowest_power"] > w and body["gap"] is None
        assert {j["id"]: j["point"] for j in body["jobs"]} == {
            a: len(pa) - 1,
            b: len(pb_) - 1,
            c: len(pa) - 1,
        }
        http.delete(f"/jobs/{c}")
        assert _until(http, lambda b: b == before) == before  # merged: within half a second

        # PUT /plan on a budgeted job is refused; DELETE returns every job to its own policy
        r = http.put(f"/jobs/{a}/plan", json={"index": 1})
        assert r.status_code == 409 and problem_field(r) == "power_budget"
        assert http.delete("/power-budget").status_code == 204
        assert _deployed(http, a) == [0] and _deployed(http, b) == [0, 0]
        assert http.get("/power-budget").status_code == 404
        assert http.delete("/power-budget").status_code == 404
        assert http.get(f"/jobs/{a}/status").json()["power_budget"] is None
        stream.cancel()
        channel.close()


def test_bad_budgets_are_refused_and_change_nothing(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str, two_pipelines: str
) -> None:
    other = solved_job(http, small_csv)
    register_all(stub, other, 2)
    register_all(stub, two_pipelines, 2, 2, tp=2)
    ok = http.put("/power-budget", json={"watts": 1e5, "jobs": [two_pipelines, other]})
    assert ok.status_code == 200, ok.text
    before = http.get("/power-budget").json()
    version = http.get(f"/jobs/{other}").json()["plan_version"]
    bodies: list[tuple[Any, str]] = [
        ({"watts": -5}, "watts"),
        ({"watts": 0}, "watts"),
        ({"watts": "many"}, "watts"),
        ({"watts": 1.0}, "watts"),  # below the lowest achievable
        ({"watts": 1e5, "policy": "greedy"}, "policy"),
        ({"watts": 1e5, "jobs": ["nope"]}, "jobs.0"),
        ({"watts": 1e5, "jobs": [other, other]}, "jobs"),
        ({"watts": 1e5, "extra": 1}, "extra"),
        ({}, "watts"),
    ]
    for body, field in bodies:
        r = http.put("/power-budget", json=body)
        assert r.status_code == 422 and problem_field(r) == field, (body, r.text)
    r = http.put("/power-budget", json={"watts": 1.0, "jobs": [other]})
    assert r.json()["lowest_power"] == pytest.approx(
        min(p["average_power"] for p in _points(http, other))
    )
    for raw in (b'{"watts": NaN}', b'{"watts": Infinity}'):
        r = http.put("/power-budget", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422
    assert http.get("/power-budget").json() == before
    assert http.get(f"/jobs/{other}").json()["plan_version"] == version
    assert http.delete("/power-budget").status_code == 204


def test_a_restart_keeps_the_budget_and_its_plans(tmp_path: Path, small_csv: str) -> None:
    db = tmp_path / "perseus.db"
    with (
        ServerProcess(db) as srv,
        httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=60.0) as http,
    ):
        a = solved_job(http, small_csv)
        b = solved_job(http, small_csv, data_parallel=2)
        with grpc.insecure_channel(srv.grpc_target) as channel:
            register_all(pb_grpc.PlanServiceStub(channel), a, 2)
            register_all(pb_grpc.PlanServiceStub(channel), b, 2, 2)
        pa, pb_ = _points(http, a), _points(http, b)
        lowest = pa[-1]["average_power"] + pb_[-1]["average_power"]
        w = lowest + 0.5 * (pa[0]["average_power"] + pb_[0]["average_power"] - lowest)
        r = http.put("/power-budget", json={"watts": w, "policy": "fair", "jobs": [a, b]})
        assert r.status_code == 200, r.text
        body = r.json()
        versions = {j: http.get(f"/jobs/{j}").json()["plan_version"] for j in (a, b)}
        plans = {j: _deployed(http, j) for j in (a, b)}
    with (
        ServerProcess(db) as srv,
        httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=60.0) as http,
    ):
        assert http.get("/power-budget").json() == body
        assert {j: http.get(f"/jobs/{j}").json()["plan_version"] for j in (a, b)} == versions
        assert {j: _deployed(http, j) for j in (a, b)} == plans
        assert http.get(f"/jobs/{a}/status").json()["plan"]["constraint"] == "power budget"


def exercise_power_budget(c: Any, job_id: str) -> None:
    """``/power-budget``'s documented answers through a :class:`Contract`.

    Each body is checked against the published schema; for ``test_openapi_lifecycle`` to call
    with a solved job that has a rank registered.
    """
    c.call("GET", "/power-budget", 404)
    body = c.call("PUT", "/power-budget", 200, json={"watts": 1e5, "jobs": [job_id]}).json()
    assert body["feasible"] and [j["id"] for j in body["jobs"]] == [job_id]
    c.call("GET", "/power-budget", 200)
    c.call("GET", "/jobs/{job_id}/status", 200, path={"job_id": job_id})
    c.call("GET", "/jobs/{job_id}/frontier", 200, path={"job_id": job_id})
    c.call("PUT", "/power-budget", 422, json={"watts": -1})
    c.call("DELETE", "/power-budget", 204)
    c.call("DELETE", "/power-budget", 404)


def test_power_budget_answers_match_the_published_schema(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, two_pipelines: str
) -> None:
    from ..rest.test_docs_openapi import Contract

    register_all(stub, two_pipelines, 2, 2, tp=2)
    c = Contract(http)
    exercise_power_budget(c, two_pipelines)
    c.call("GET", "/jobs/{job_id}/plan", 200, path={"job_id": two_pipelines},
           params={"power_budget": 1e5})  # fmt: skip
    assert {(m, t) for m, t, s, _ in c.seen if s < 300} >= {
        ("PUT", "/power-budget"),
        ("GET", "/power-budget"),
        ("DELETE", "/power-budget"),
    }
