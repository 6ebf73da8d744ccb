"""Swing-bounded plan queries and deployments on a real ``perseus serve``.

``GET /jobs/{id}/plan`` carries the plan's ``power_timeline``; with ``max_swing`` /
``max_ramp`` it answers the plan and ``power_floors`` of least energy within the policy's
deadline, whose timeline (recomputed here from the floors and the core's model, on the job's
profile) meets the bounds; bad bounds are 422s naming the field. ``PUT /jobs/{id}/plan`` with
bounds pushes every rank its floors over gRPC, and the policy survives a restart of the view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from perseus.power import SwingBounds
from perseus.power.floors import meets
from perseus.power_timeline import PowerTimeline, rank_power
from perseus.problem import EnergyProblem
from perseus.profiles import parse_profile_csv
from perseus.schedules import one_f_one_b
from perseus_client import PerseusClient, RankPosition, Reporting, SimulatedGpu
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import BLOCKING_A40, problem_field, register, sliced_profile_csv, solved_job


@pytest.fixture(scope="module")
def csv() -> str:
    return sliced_profile_csv(stages=4, every=6)


@pytest.fixture(scope="module")
def job(http: httpx.Client, csv: str) -> str:
    return solved_job(http, csv, stages=4, microbatches=6, data_parallel=2)


def _floored(csv: str, doc: dict[str, Any]) -> PowerTimeline:
    """The job's timeline with the answer's floors, from the core's model (two pipelines)."""
    problem = EnergyProblem.build(parse_profile_csv(csv), one_f_one_b(4, 6), BLOCKING_A40)
    opts = np.array(
        [
            int(np.flatnonzero(problem.freqs[v] == f)[0])
            for v, f in enumerate(x for rank in doc["frequencies"] for x in rank)
        ],
        dtype=np.uint8,
    )
    rp = rank_power(problem, opts)
    times = np.unique(
        np.concatenate(
            [rp.times, [x for r in doc["power_floors"] for s, e, _ in r for x in (s, e)]]
        )
    )
    mid = 0.5 * (times[:-1] + times[1:])
    k = np.searchsorted(rp.times, mid, side="right") - 1
    power = rp.watts[:, k].copy()
    for r, spans in enumerate(doc["power_floors"]):
        for s, e, w in spans:
            on = (mid >= s) & (mid < e)
            power[r, on] = np.maximum(power[r, on], w)
    return PowerTimeline(times, 2 * power.sum(axis=0))


def test_every_plan_document_has_its_power_timeline(http: httpx.Client, job: str) -> None:
    doc = http.get(f"/jobs/{job}/plan", params={"slowdown": 0}).json()
    tl = doc["power_timeline"]
    assert tl["peak_w"] >= tl["average_w"] >= tl["trough_w"] > 0
    assert tl["swing"] == pytest.approx(1 - tl["trough_w"] / tl["peak_w"])
    assert 0 < tl["max_change_w"]["0.1"] <= tl["peak_w"] - tl["trough_w"] + 1e-9
    assert 0 <= tl["band_share"] <= 1
    # Two pipelines: the average is the job's average power.
    assert tl["average_w"] == pytest.approx(doc["average_power"], rel=1e-9)
    assert "power_floors" not in doc


def test_a_swing_bounded_query_answers_floors_that_meet_the_bounds(
    http: httpx.Client, job: str, csv: str
) -> None:
    params = {"slowdown": 0, "max_swing": 0.3, "max_ramp": 0.12}
    doc = http.get(f"/jobs/{job}/plan", params=params).json()
    assert doc["swing_bounds"] == {"max_swing": 0.3, "max_ramp": 0.12, "window": 0.1}
    assert len(doc["power_floors"]) == 4
    assert doc["power_timeline_before"]["swing"] > 0.3
    assert doc["power_timeline"]["swing"] <= 0.3 + 1e-6
    assert doc["time"] <= doc["max_frequency_time"] * (1 + 1e-12)
    assert doc["energy_with_floors"] == pytest.approx(2 * doc["energy"] + doc["floor_energy"])
    floored = _floored(csv, doc)
    assert meets(floored, SwingBounds(0.3, 0.12))
    assert floored.energy == pytest.approx(doc["energy_with_floors"], rel=1e-6)
    assert floored.peak == pytest.approx(doc["power_timeline"]["peak_w"], rel=1e-6)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_swing": 1.5}, "max_swing"),
        ({"max_swing": -0.1}, "max_swing"),
        ({"max_ramp": "nan"}, "max_ramp"),
        ({"max_ramp": 0.1, "ramp_window": 0}, "ramp_window"),
        ({"ramp_window": 0.2}, "ramp_window"),
    ],
)
def test_bad_bounds_are_422s_naming_the_field(
    http: httpx.Client, job: str, params: dict[str, Any], field: str
) -> None:
    r = http.get(f"/jobs/{job}/plan", params={"slowdown": 0, **params})
    assert r.status_code == 422, r.text
    assert problem_field(r) == field


def test_a_bounded_deployment_pushes_each_rank_its_floors(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, job: str, csv: str
) -> None:
    streams = {}
    for r in range(4):
        rank = register(stub, job, r, r).rank_id
        streams[r] = stub.WatchPlan(pb.WatchPlanRequest(job_id=job, rank_id=rank), timeout=60)
        first = next(streams[r])
        assert list(first.power_floors) == [] and first.plan_swing == 0.0
    r = http.put(f"/jobs/{job}/plan", json={"slowdown": 0, "max_swing": 0.3, "max_ramp": 0.12})
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["policy"]["swing"] == {"max_swing": 0.3, "max_ramp": 0.12, "ramp_window": 0.1}
    floors = view["swing"]["power_floors"]
    tl = view["power_timeline"]
    assert tl["swing"] <= 0.3 + 1e-6 and tl["before"]["swing"] == view["swing"]["plan_swing"]
    assert 0 < len(tl["samples"]["t"]) == len(tl["samples"]["w"]) <= 400
    assert min(tl["samples"]["w"]) == pytest.approx(tl["trough_w"], abs=0.01)
    assert view["swing"]["plan_swing"] > 0.3 and len(floors) == 4
    pushed, clocks = {}, {}
    for rr, stream in streams.items():
        msg = next(stream)
        assert msg.version == view["version"] and msg.plan_swing == view["swing"]["plan_swing"]
        pushed[rr] = [[f.start_s, f.end_s, f.watts] for f in msg.power_floors]
        clocks[rr] = [s.frequency_mhz for s in msg.steps]
        stream.cancel()
    assert [pushed[rr] for rr in range(4)] == floors
    # What the ranks run (the searched plan, its floors) meets the bounds.
    doc = {"frequencies": [clocks[rr] for rr in range(4)], "power_floors": floors}
    assert meets(_floored(csv, doc), SwingBounds(0.3, 0.12))
    # Floors are the whole job's: not for some pipelines only; and a plain PUT drops them.
    bad = http.put(f"/jobs/{job}/plan", json={"max_swing": 0.3, "pipelines": [0]})
    assert bad.status_code == 422 and problem_field(bad) == "max_swing"
    plain = http.put(f"/jobs/{job}/plan", json={"slowdown": 0}).json()
    assert "swing" not in plain and "swing" not in plain["policy"]


def test_a_bounded_put_deploys_the_searched_plan_and_floors_the_get_answers(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, job: str
) -> None:
    params = {"slowdown": 0, "max_swing": 0.3, "max_ramp": 0.12}
    answer = http.get(f"/jobs/{job}/plan", params=params).json()
    # The search moved clocks off the frontier point: deploying the point would differ.
    assert not answer["plan_is_frontier_point"]
    ranks = [register(stub, job, r, r).rank_id for r in range(4)]
    view = http.put(f"/jobs/{job}/plan", json=params).json()
    assert view["swing"]["power_floors"] == answer["power_floors"]
    assert view["swing"]["time"] == pytest.approx(answer["time"])
    assert view["swing"]["searched"] and not view["swing"]["plan_is_frontier_point"]
    assert view["power_timeline"]["peak_w"] == pytest.approx(answer["power_timeline"]["peak_w"])
    # Per GPU: the job's ramp bound shared by its 8 GPUs (4 stages x 2 pipelines), W/s.
    ramp = 0.12 * answer["power_timeline"]["peak_w"] / 0.1 / 8
    assert answer["ramp_w_per_s"] == pytest.approx(ramp)
    for r, rank in enumerate(ranks):
        stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job, rank_id=rank), timeout=60)
        msg = next(stream)
        stream.cancel()
        assert msg.version == view["version"]
        assert [s.frequency_mhz for s in msg.steps] == answer["frequencies"][r]
        assert [[f.start_s, f.end_s, f.watts] for f in msg.power_floors] == answer["power_floors"][
            r
        ]
        assert msg.expected_iteration_time == pytest.approx(answer["time"])
        assert msg.ramp_w_per_s == pytest.approx(ramp)
    http.put(f"/jobs/{job}/plan", json={"slowdown": 0})


def test_a_power_budget_with_swing_bounds_counts_the_floors(http: httpx.Client, job: str) -> None:
    """The floors' energy is the budget's: a slower plan keeps it, or a 422 says none does."""
    bounds = {"max_swing": 0.3, "max_ramp": 0.12}
    plain = http.get(f"/jobs/{job}/plan", params={"slowdown": 0}).json()
    budget = plain["average_power"] * 1.0001  # the fastest plan just fits; its floors do not
    doc = http.get(f"/jobs/{job}/plan", params={"power_budget": budget, **bounds}).json()
    assert doc["energy_with_floors"] / doc["time"] <= budget * (1 + 1e-9)
    assert doc["time"] > plain["time"]  # a slower plan, so the floors fit under the budget
    view = http.put(f"/jobs/{job}/plan", json={"power_budget": budget, **bounds})
    assert view.status_code == 200, view.text
    assert view.json()["swing"]["power_floors"] == doc["power_floors"]
    assert view.json()["swing"]["time"] == pytest.approx(doc["time"])
    # The least power of any plan: it fits alone, but not with its floors.
    lowest = http.get(f"/jobs/{job}/plan", params={"power_budget": 1}).json()["lowest_power"]
    for r in (
        http.get(f"/jobs/{job}/plan", params={"power_budget": lowest * 1.0001, **bounds}),
        http.put(f"/jobs/{job}/plan", json={"power_budget": lowest * 1.0001, **bounds}),
    ):
        assert r.status_code == 422, r.text
        assert problem_field(r) == "power_budget"
        assert r.json()["lowest_power"] > lowest * 1.0001
        assert "max_swing" in r.json()["detail"]
    after = http.get(f"/jobs/{job}/status").json()["plan"]  # the refused PUT changed nothing
    assert after["version"] == view.json()["version"]
    http.put(f"/jobs/{job}/plan", json={"slowdown": 0})


def test_a_rank_that_cannot_hold_its_floor_shows_in_the_job_status(
    server: ServerProcess, http: httpx.Client, small_csv: str
) -> None:
    """Real clients over gRPC: rank 0's GPU holds its floors, rank 1's cannot (and says why)."""
    job = solved_job(http, small_csv, stages=2, microbatches=4)
    view = http.put(f"/jobs/{job}/plan", json={"slowdown": 0, "max_swing": 0.3}).json()
    assert any(view["swing"]["power_floors"])
    gpus = [
        SimulatedGpu.from_profile_csv(small_csv, stage=0, time_scale=0.02),
        SimulatedGpu.from_profile_csv(small_csv, stage=1, time_scale=0),  # no idle to floor
    ]
    clients = [
        PerseusClient(
            server.grpc_target,
            job,
            gpu=gpu,
            handle_signals=False,
            rank=RankPosition(global_rank=s, pipeline_rank=s, data_rank=0),
            reporting=Reporting(report_interval=0.05),
        )  # fmt: skip
        for s, gpu in enumerate(gpus)
    ]
    try:
        threads = [threading.Thread(target=_train, args=(c, 3)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert "cannot hold a power floor" in (clients[1].floor_status or "")
        status = _wait(lambda: _floors_said(http, job), "both ranks' floor states")
    finally:
        for c in clients:
            c.close()
    ranks = {r["global_rank"]: r for r in status["ranks"]}
    swing = view["swing"]["plan_swing"]
    assert ranks[0]["power_floor"] == "held" and ranks[0]["power_floor_reason"] is None
    assert ranks[1]["power_floor"] == "unavailable"
    assert "time_scale=0" in ranks[1]["power_floor_reason"]
    assert ranks[1]["plan_swing"] == pytest.approx(swing)
    unheld = status["plan"]["swing"]["ranks_without_floor"]
    assert unheld == [{"rank": 1, "reason": ranks[1]["power_floor_reason"], "plan_swing": swing}]


def _floors_said(http: httpx.Client, job: str) -> dict[str, Any] | None:
    status: dict[str, Any] = http.get(f"/jobs/{job}/status").json()
    return status if all("power_floor" in r for r in status["ranks"]) else None


def _train(client: PerseusClient, iterations: int) -> None:
    plan = _wait(lambda: client.latest_plan, "a plan")
    for _ in range(iterations):
        order = [(s.instruction, s.microbatch, s.stage) for s in (client.latest_plan or plan).steps]
        with client.iteration():
            for kind, mb, stage in order:
                with client.instruction(kind, microbatch=mb, stage=stage):
                    pass


def _wait(fn: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)
