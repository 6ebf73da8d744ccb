"""Straggler replanning: explicit reports over REST and detection from ReportIterations."""

from __future__ import annotations

import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server.decisions.detectors import StragglerDetector

from ..conftest import BLOCKING_A40, problem_field, register, solved_job


@pytest.fixture(scope="module")
def job(http: httpx.Client, small_csv: str) -> str:
    return solved_job(http, small_csv, data_parallel=2)


def _indices(http: httpx.Client, job_id: str) -> list[int]:
    return [p["index"] for p in http.get(f"/jobs/{job_id}/status").json()["plan"]["pipelines"]]


def test_reported_straggler_slows_the_others(http: httpx.Client, job: str) -> None:
    front = http.get(f"/jobs/{job}/frontier").json()
    t_base = front["points"][0]["time"]
    for body, field in (
        ({"pipeline": 7, "slowdown": 0.2}, "pipeline"),
        ({"pipeline": 1}, "slowdown"),
        ({"pipeline": 1, "slowdown": 0.2, "iteration_time": 3.0}, "slowdown"),
        ({"pipeline": 1, "slowdown": -1}, "slowdown"),
    ):
        r = http.post(f"/jobs/{job}/stragglers", json=body)
        assert r.status_code == 422 and problem_field(r) == field, r.text
    version = http.get(f"/jobs/{job}/status").json()["plan"]["version"]
    st = http.post(f"/jobs/{job}/stragglers", json={"pipeline": 1, "slowdown": 0.2}).json()
    plan = st["plan"]
    assert plan["version"] == version + 1
    p0, p1 = plan["pipelines"]
    assert p1["index"] == 0 and "straggler" in p1["reason"]
    assert (
        p0["index"] > 0
        and p0["time"] <= t_base * 1.2 * (1 + 1e-9)
        and "straggler pipeline 1" in p0["reason"]
    )
    # The least energy over an iteration of T' seconds, waiting at blocking power included.
    t_prime = t_base * 1.2
    cost = {
        i: pt["energy"] + BLOCKING_A40 * 2 * (t_prime - pt["time"])
        for i, pt in enumerate(front["points"])
        if pt["time"] <= t_prime * (1 + 1e-12)
    }
    assert p0["index"] == min(cost, key=cost.__getitem__)
    assert st["pipelines"][1]["straggler"]["source"] == "reported" and st["recent_replans"]
    assert (
        f'perseus_replans_total{{perseus_job="{job}",reason="reported"}}'
        in http.get("/metrics").text
    )
    assert http.delete(f"/jobs/{job}/stragglers", params={"pipeline": 0}).status_code == 404
    st = http.delete(f"/jobs/{job}/stragglers", params={"pipeline": 1}).json()
    assert [p["index"] for p in st["plan"]["pipelines"]] == [0, 0] and st["plan"][
        "version"
    ] == version + 2


def test_detected_straggler_and_recovery(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, job: str
) -> None:
    leaders = {d: register(stub, job, d * 2, 0, data_rank=d).rank_id for d in (0, 1)}
    status = http.get(f"/jobs/{job}/status").json()
    version = status["plan"]["version"]
    t_plan = status["plan"]["pipelines"][1]["time"]

    def report(d: int, times: list[float], v: int, start: int) -> None:
        reps = [
            pb.IterationReport(
                job_id=job,
                rank_id=leaders[d],
                iteration=start + i,
                iteration_time=t,
                plan_version=v,
            )
            for i, t in enumerate(times)
        ]
        stub.ReportIterations(iter(reps), timeout=10)

    report(0, [t_plan] * 3, version, 0)
    report(1, [t_plan * 1.25] * 2, version, 0)
    assert _indices(http, job) == [0, 0]  # two slow iterations are not enough
    report(1, [t_plan * 1.25], version, 2)
    st = http.get(f"/jobs/{job}/status").json()
    assert st["plan"]["version"] == version + 1
    assert st["pipelines"][1]["straggler"] == {
        "time": pytest.approx(t_plan * 1.25),
        "source": "detected",
    }
    idx = _indices(http, job)
    assert idx[1] == 0 and idx[0] > 0
    # Slow iterations under the old version, or in the hysteresis band, change nothing; three
    # iterations back at the plan's time under the new version restore the default plan.
    report(1, [t_plan * 1.03] * 3, version + 1, 3)
    assert _indices(http, job) == idx
    report(1, [t_plan] * 3, version + 1, 6)
    st = http.get(f"/jobs/{job}/status").json()
    assert _indices(http, job) == [0, 0] and st["pipelines"][1]["straggler"] is None
    assert st["plan"]["version"] == version + 2
    metrics = http.get("/metrics").text
    assert (
        f'perseus_replans_total{{perseus_job="{job}",reason="detected"}}' in metrics
        and f'perseus_replans_total{{perseus_job="{job}",reason="recovered"}}' in metrics
    )


def test_a_detected_stragglers_new_pace_moves_the_others_again(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    """A straggler that slows down further (or partly recovers) is re-measured.

    Three slow iterations in a row all more than the threshold away from T' give the new T'; a
    drift within the threshold changes nothing.
    """
    job = solved_job(http, small_csv, data_parallel=2)
    leaders = {d: register(stub, job, d * 2, 0, data_rank=d).rank_id for d in (0, 1)}
    status = http.get(f"/jobs/{job}/status").json()
    version = status["plan"]["version"]
    t_plan = status["plan"]["pipelines"][1]["time"]
    it = iter(range(1000))

    def report(d: int, times: list[float], v: int) -> None:
        stub.ReportIterations(
            iter(
                pb.IterationReport(job_id=job, rank_id=leaders[d], iteration=next(it),
                                   iteration_time=t, plan_version=v)
                for t in times
            ),
            timeout=10,
        )  # fmt: skip

    def straggler() -> dict:
        return http.get(f"/jobs/{job}/status").json()["pipelines"][1]["straggler"]

    report(0, [t_plan] * 3, version)
    report(1, [t_plan * 1.2] * 3, version)
    assert straggler()["time"] == pytest.approx(t_plan * 1.2)
    first = _indices(http, job)[0]
    report(1, [t_plan * 1.22, t_plan * 1.23, t_plan * 1.21], version + 1)  # within 5 %
    assert straggler()["time"] == pytest.approx(t_plan * 1.2)
    report(1, [t_plan * 1.45, t_plan * 1.5, t_plan * 1.44], version + 1)
    st = http.get(f"/jobs/{job}/status").json()
    assert st["plan"]["version"] == version + 2
    assert st["pipelines"][1]["straggler"] == {
        "time": pytest.approx(t_plan * 1.45),
        "source": "detected",
    }
    assert _indices(http, job)[0] > first  # a slower, cheaper plan for the healthy pipeline
    assert "pace changed" in st["recent_replans"][-1]["why"]
    assert (
        f'perseus_replans_total{{perseus_job="{job}",reason="pace_changed"}}'
        in http.get("/metrics").text
    )


def test_detection_settings(http: httpx.Client, job: str) -> None:
    r = http.put(
        f"/jobs/{job}/straggler-detection",
        json={"threshold": 0.1, "consecutive": 5, "recovery": 0.2},
    )
    assert r.status_code == 422 and problem_field(r) == "recovery"
    r = http.put(
        f"/jobs/{job}/straggler-detection",
        json={"threshold": 0.1, "consecutive": 5, "recovery": 0.05},
    )
    assert r.status_code == 200
    assert http.get(f"/jobs/{job}/status").json()["straggler_detection"] == {
        "threshold": 0.1,
        "consecutive": 5,
        "recovery": 0.05,
    }


def test_t_prime_is_not_dragged_down_by_the_iteration_that_straddles_the_slowdown() -> None:
    """The first slow iteration often ran partly at the old pace.

    T' is the straggler's new pace (the median of the slow iterations), not their mean.
    """
    det = StragglerDetector()
    for _ in range(5):
        assert det.observe(1, 1.0, 1.0, False) == (None, 0.0)
        det.observe(0, 1.0, 1.0, False)
    assert det.observe(1, 1.1, 1.0, False)[0] is None
    assert det.observe(1, 1.25, 1.0, False)[0] is None
    event, t_prime = det.observe(1, 1.26, 1.0, False)
    assert event == "slow" and t_prime == pytest.approx(1.25)


def test_detector_reports_a_changed_pace_only_when_every_slow_iteration_is_off() -> None:
    det = StragglerDetector()
    for _ in range(3):
        det.observe(0, 1.0, 1.0, False)
    assert det.observe(1, 1.3, 1.0, True, current=1.2)[0] is None
    assert det.observe(1, 1.3, 1.0, True, current=1.2)[0] is None
    assert det.observe(1, 1.24, 1.0, True, current=1.2)[0] is None  # within 5 % of T'
    assert det.observe(1, 1.35, 1.0, True, current=1.2)[0] is None
    assert det.observe(1, 1.3, 1.0, True, current=1.2)[0] is None  # 1.24 is still in the window
    assert det.observe(1, 1.32, 1.0, True, current=1.2) == ("changed", pytest.approx(1.32))
    # not for a straggler whose T' came from elsewhere (a report)
    for _ in range(3):
        assert det.observe(1, 1.5, 1.0, True)[0] is None


def test_a_straggler_report_needs_another_pipeline_and_a_slower_time(
    http: httpx.Client, job: str, small_csv: str
) -> None:
    single = solved_job(http, small_csv, data_parallel=1)
    r = http.post(f"/jobs/{single}/stragglers", json={"pipeline": 0, "slowdown": 0.2})
    assert r.status_code == 409 and problem_field(r) == "pipeline", r.text
    assert "one pipeline" in r.json()["detail"]
    t_plan = http.get(f"/jobs/{job}/plan", params={"slowdown": 0}).json()["time"]
    version = http.get(f"/jobs/{job}/status").json()["plan"]["version"]
    r = http.post(f"/jobs/{job}/stragglers", json={"pipeline": 1, "iteration_time": 0.5 * t_plan})
    assert r.status_code == 422 and problem_field(r) == "iteration_time", r.text
    assert http.get(f"/jobs/{job}/status").json()["plan"]["version"] == version  # nothing changed
    r = http.post(f"/jobs/{job}/stragglers", json={"pipeline": 9, "slowdown": 0.2})
    assert r.status_code == 422 and "data_parallel" in r.json()["detail"]


# --- detection settings need hysteresis ------------------------------------------------------


@pytest.fixture(scope="module")
def detection_job(http: httpx.Client, small_csv: str) -> str:
    """A job of its own whose detection settings the hysteresis test changes."""
    return solved_job(http, small_csv)


@pytest.mark.parametrize(
    ("threshold", "recovery"), [(0.05, 0.05), (0.1, 0.1), (0.05, 0.2), (1.0, 1.0)]
)
def test_detection_without_hysteresis_is_refused(
    http: httpx.Client, detection_job: str, threshold: float, recovery: float
) -> None:
    job_id = detection_job
    before = http.get(f"/jobs/{job_id}/status").json()["straggler_detection"]
    r = http.put(
        f"/jobs/{job_id}/straggler-detection",
        json={"threshold": threshold, "consecutive": 3, "recovery": recovery},
    )
    assert r.status_code == 422 and problem_field(r) == "recovery"
    assert http.get(f"/jobs/{job_id}/status").json()["straggler_detection"] == before
    just_below = {"threshold": threshold, "consecutive": 3, "recovery": threshold * 0.99}
    r = http.put(f"/jobs/{job_id}/straggler-detection", json=just_below)
    assert r.status_code == 200, r.text
