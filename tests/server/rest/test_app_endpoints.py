"""REST API against a real server subprocess: jobs, frontiers and plans, bad input leaving state intact.

A profile's routes are ``test_profiles.py``'s, ``/healthz`` and ``/metrics`` ``test_monitoring.py``'s.
"""

from __future__ import annotations

import math

import httpx
import pytest

from perseus.schedules import make_schedule

from ..conftest import make_job, problem_field, solved_job, wait_frontier


def test_job_crud(http: httpx.Client) -> None:
    job_id = make_job(http, name="crud", data_parallel=2, tensor_parallel=2)
    job = http.get(f"/jobs/{job_id}").json()
    assert (
        job["stages"] == 2
        and job["microbatches"] == 4
        and job["world_size"] == 8
        and job["state"] == "created"
    )
    assert job["instructions"] == 16
    assert job_id in [j["id"] for j in http.get("/jobs").json()["jobs"]]
    assert http.delete(f"/jobs/{job_id}").status_code == 204
    r = http.get(f"/jobs/{job_id}")
    assert r.status_code == 404 and problem_field(r) == "job_id"
    assert http.delete(f"/jobs/{job_id}").status_code == 404


def test_job_schedules(http: httpx.Client) -> None:
    j = http.post(
        "/jobs",
        json={
            "blocking_power": 70.0,
            "stages": 2,
            "microbatches": 4,
            "schedule": {"name": "interleaved-1f1b", "virtual_stages": 2},
        },
    ).json()
    assert j["instructions"] == 2 * 4 * 2 * 2 and j["schedule"] == {
        "name": "interleaved-1f1b",
        "virtual_stages": 2,
    }
    orders = make_schedule("gpipe", 2, 3).to_json()["orders"]
    r = http.post(
        "/jobs",
        json={
            "blocking_power": 70.0,
            "stages": 2,
            "microbatches": 3,
            "schedule": {"name": "custom", "orders": orders},
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["schedule"]["orders"] == orders


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"stages": 0, "microbatches": 4}, "stages"),
        ({"stages": 2, "microbatches": "four"}, "microbatches"),
        ({"stages": 2, "microbatches": True}, "microbatches"),
        ({"stages": 2}, "microbatches"),
        ({"stages": 2, "microbatches": 4, "schedule": "zigzag"}, "schedule"),
        (
            {
                "stages": 2,
                "microbatches": 3,
                "schedule": {"name": "interleaved-1f1b", "virtual_stages": 2},
            },
            "schedule",
        ),
        ({"stages": 2, "microbatches": 4, "schedule": {"name": "custom"}}, "schedule.orders"),
        (
            {
                "stages": 2,
                "microbatches": 1,
                "schedule": {
                    "name": "custom",
                    "orders": [[["forward", 0, 0]], [["forward", 0, 1], ["backward", 0, 1]]],
                },
            },
            "schedule.orders",
        ),
        (
            {
                "stages": 3,
                "microbatches": 1,
                "schedule": {"name": "custom", "orders": [[["forward", 0, 0], ["backward", 0, 0]]]},
            },
            "schedule.orders",
        ),
        ({"stages": 2, "microbatches": 4, "blocking_power": -1}, "blocking_power"),
        ({"stages": 2, "microbatches": 4, "data_parallel": 100000}, "data_parallel"),
        ({"stages": 200, "microbatches": 4}, "stages"),
        ({"stages": 64, "microbatches": 1024}, "microbatches"),
        ({"stages": 2, "microbatches": 4, "bogus": 1}, "bogus"),
    ],
)
def test_bad_jobs_name_the_field(http: httpx.Client, body: dict, field: str) -> None:
    before = len(http.get("/jobs").json()["jobs"])
    r = http.post("/jobs", json=body)
    assert r.status_code == 422, r.text
    assert problem_field(r) == field, r.json()
    assert len(http.get("/jobs").json()["jobs"]) == before


def test_malformed_and_oversized_bodies(http: httpx.Client) -> None:
    r = http.post("/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and problem_field(r) == "body"
    r = http.post(
        "/jobs", content=b"x" * (5 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and problem_field(r) == "body"

    def chunks():
        for _ in range(80):
            yield b"y" * 65536

    r = http.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = http.get("/no/such/route")
    assert r.status_code == 404 and problem_field(r) == "path"


@pytest.fixture(scope="module")
def solved(http: httpx.Client, small_csv: str) -> str:
    return solved_job(http, small_csv, data_parallel=2)


def test_frontier_needs_a_profile(http: httpx.Client) -> None:
    job_id = make_job(http)
    r = http.post(f"/jobs/{job_id}/frontier")
    assert r.status_code == 409 and problem_field(r) == "profile"
    r = http.get(f"/jobs/{job_id}/plan", params={"slowdown": 0.1})
    assert r.status_code == 409 and problem_field(r) == "frontier"
    r = http.delete(f"/jobs/{job_id}/frontier")
    assert r.status_code == 409
    assert http.get(f"/jobs/{job_id}/frontier").json()["status"] == "none"
    assert http.get(f"/jobs/{job_id}/frontier.png").status_code == 409


def test_frontier_points_and_png(http: httpx.Client, solved: str) -> None:
    st = http.get(f"/jobs/{solved}/frontier").json()
    assert st["status"] == "done" and st["progress"] == 1.0 and st["error"] is None
    pts = st["points"]
    assert len(pts) == st["num_points"] >= 2
    times = [p["time"] for p in pts]
    energies = [p["energy"] for p in pts]
    assert times == sorted(times) and energies[-1] < energies[0]
    assert all(p["lower_bound"] <= p["energy"] * (1 + 1e-9) for p in pts)
    assert times[0] <= st["max_frequency_time"] * (1 + 1e-9)
    png = http.get(f"/jobs/{solved}/frontier.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n"
    assert http.get(f"/jobs/{solved}").json()["state"] == "ready"


def test_plan_queries(http: httpx.Client, solved: str) -> None:
    pts = http.get(f"/jobs/{solved}/frontier").json()["points"]
    t0 = http.get(f"/jobs/{solved}/frontier").json()["max_frequency_time"]
    for slowdown in (0.0, 0.05, 0.2):
        plan = http.get(f"/jobs/{solved}/plan", params={"slowdown": slowdown}).json()
        ok = [p for p in pts if p["time"] <= t0 * (1 + slowdown) * (1 + 1e-12)]
        assert plan["energy"] == min(p["energy"] for p in ok)  # the least-energy plan that fits
        assert plan["time"] <= t0 * (1 + slowdown) * (1 + 1e-9)
        assert len(plan["frequencies"]) == 2 and all(len(r) == 8 for r in plan["frequencies"])
    mid = pts[len(pts) // 2]
    plan = http.get(f"/jobs/{solved}/plan", params={"deadline": mid["time"]}).json()
    assert plan["time"] <= mid["time"]
    assert plan["energy"] == min(p["energy"] for p in pts if p["time"] <= mid["time"])
    plan = http.get(f"/jobs/{solved}/plan", params={"energy_budget": mid["energy"]}).json()
    assert plan["energy"] <= mid["energy"] and plan["time"] <= mid["time"]
    assert math.isclose(plan["time"], pts[plan["index"]]["time"])
    plan = http.get(f"/jobs/{solved}/plan", params={"index": 0, "steps": True}).json()
    assert plan["steps"][0][0] == {
        "instruction": "forward",
        "microbatch": 0,
        "stage": 0,
        "frequency": plan["frequencies"][0][0],
    }


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"deadline": 1e-6}, "deadline"),
        ({"energy_budget": 1.0}, "energy_budget"),
        ({"index": 10_000}, "index"),
        ({"slowdown": -0.1}, "slowdown"),
        ({"deadline": "soon"}, "deadline"),
        ({"deadline": "nan"}, "deadline"),
        ({}, "deadline"),
        ({"deadline": 10, "slowdown": 0.1}, "slowdown"),
    ],
)
def test_bad_plan_queries(http: httpx.Client, solved: str, params: dict, field: str) -> None:
    r = http.get(f"/jobs/{solved}/plan", params=params)
    assert r.status_code == 422, r.text
    assert problem_field(r) == field


def test_deploy_plans(http: httpx.Client, solved: str) -> None:
    status = http.get(f"/jobs/{solved}/status").json()
    plan = status["plan"]
    assert plan["kind"] == "plan" and [p["index"] for p in plan["pipelines"]] == [0, 0]
    version = plan["version"]
    want = http.get(f"/jobs/{solved}/plan", params={"slowdown": 0.1}).json()
    dep = http.put(f"/jobs/{solved}/plan", json={"slowdown": 0.1}).json()
    assert (
        dep["version"] == version + 1
        and [p["index"] for p in dep["pipelines"]] == [want["index"]] * 2
    )
    dep = http.put(f"/jobs/{solved}/plan", json={"index": 1, "pipelines": [1]}).json()
    assert [p["index"] for p in dep["pipelines"]] == [want["index"], 1]
    # Bad selections change nothing.
    for body, field in (
        ({"deadline": 1e-9}, "deadline"),
        ({"index": 1, "pipelines": [5]}, "pipelines"),
        ({"index": 1, "slowdown": 0.1}, "slowdown"),
        ({"energy": 3}, "energy"),
    ):
        r = http.put(f"/jobs/{solved}/plan", json=body)
        assert r.status_code == 422 and problem_field(r) == field, r.text
    assert http.get(f"/jobs/{solved}/status").json()["plan"]["version"] == version + 2
    dep = http.put(f"/jobs/{solved}/plan", json={}).json()
    assert [p["index"] for p in dep["pipelines"]] == [0, 0] and dep["reason"].startswith("default")


def test_status_shape(http: httpx.Client, solved: str) -> None:
    st = http.get(f"/jobs/{solved}/status").json()
    assert st["state"] == "ready" and st["expected_ranks"] == 4
    assert {"registered_ranks", "connected_ranks", "plan", "frontier", "pipelines", "ranks"} <= set(
        st
    )
    assert [p["pipeline"] for p in st["pipelines"]] == [0, 1]
    assert http.get("/jobs/nope/status").status_code == 404


def test_resolve_while_running_is_refused(http: httpx.Client, small_csv: str) -> None:
    job_id = make_job(http)
    http.put(f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"})
    assert http.post(f"/jobs/{job_id}/frontier").status_code == 202
    r = http.post(f"/jobs/{job_id}/frontier")
    if r.status_code == 409:  # still running: a second solve and a profile change are refused
        assert problem_field(r) == "frontier"
        r = http.put(
            f"/jobs/{job_id}/profile", content=small_csv, headers={"content-type": "text/csv"}
        )
        assert r.status_code in (200, 409)
    assert wait_frontier(http, job_id)["status"] == "done"
