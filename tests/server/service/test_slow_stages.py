"""A slow stage inside a pipeline.

Detected from per-instruction times, that pipeline's frontier re-solved with the stage's profile
scaled, its fastest plan deployed to it, its new time the T' of the others; recovery returns
everyone to the default plan. The stage detector's pace-change rule (unit), and a slow stage whose
pace changes re-solved again.
"""

from __future__ import annotations

import re
import time
from typing import Any

import grpc
import httpx
import pytest

from perseus.profiles import parse_profile_csv
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.decisions.detectors import DetectorSettings, StageDetector
from perseus_server.decisions.planner import Straggler
from perseus_server.domain.states import DetectorEvent, StragglerSource
from perseus_server.service.slow_stages import drop_slow_stage_straggler

from ..conftest import BLOCKING_A40, register, solved_job

MICROBATCHES = 4


@pytest.fixture(scope="module")
def job(http: httpx.Client, small_csv: str) -> str:
    return solved_job(http, small_csv, data_parallel=2)


def _status(http: httpx.Client, job: str) -> dict[str, Any]:
    return dict(http.get(f"/jobs/{job}/status").json())


class _Ranks:
    """Four registered ranks (2 stages x 2 pipelines) that report per-instruction times."""

    def __init__(self, stub: pb_grpc.PlanServiceStub, job: str, csv_text: str) -> None:
        self.stub, self.job = stub, job
        self.profile = parse_profile_csv(csv_text)
        self.freq = max(self.profile.frequencies)
        self.ids = {
            (d, s): register(stub, job, d * 2 + s, s, data_rank=d).rank_id
            for d in (0, 1)
            for s in (0, 1)
        }
        self.iteration = 0

    def report(self, factors: dict[tuple[int, int], float], version: int, n: int = 1) -> None:
        """``n`` iterations of every rank; (pipeline, stage) runs ``factors`` times slower."""
        reps = []
        for _ in range(n):
            for (d, s), rank_id in self.ids.items():
                k = factors.get((d, s), 1.0)
                ms = []
                for kind in ("forward", "backward"):
                    entry = self.profile[(s, kind)]
                    i = list(entry.frequencies).index(self.freq)
                    ms += [
                        pb.InstructionMeasurement(
                            instruction=kind,
                            microbatch=m,
                            frequency_mhz=self.freq,
                            time=float(entry.times[i]) * k,
                            stage=s,
                        )
                        for m in range(MICROBATCHES)
                    ]
                reps.append(
                    pb.IterationReport(
                        job_id=self.job,
                        rank_id=rank_id,
                        iteration=self.iteration,
                        iteration_time=1.0,  # the iteration detector is not under test here
                        plan_version=version,
                        instructions=ms,
                    )
                )
            self.iteration += 1
        self.stub.ReportIterations(iter(reps), timeout=10)


def _wait(http: httpx.Client, job: str, pred: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = _status(http, job)
        if pred(st):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached: {st}")
        time.sleep(0.1)


def test_slow_stage_resolves_and_recovers(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, job: str, small_csv: str
) -> None:
    # Iteration times are not what this test exercises: make the iteration detector inert.
    assert (
        http.put(
            f"/jobs/{job}/straggler-detection",
            json={"threshold": 0.05, "consecutive": 3, "recovery": 0.02},
        ).status_code
        == 200
    )
    ranks = _Ranks(stub, job, small_csv)
    front = http.get(f"/jobs/{job}/frontier").json()
    st = _status(http, job)
    version = st["plan"]["version"]
    slow = {(1, 1): 1.3}
    ranks.report(slow, version, n=2)
    assert _status(http, job)["pipelines"][1]["slow_stages"] is None  # 2 iterations: not yet
    ranks.report(slow, version)
    st = _wait(
        http,
        job,
        lambda s: (
            (s["pipelines"][1]["slow_stages"] or {}).get("status") == "ready"
            and s["plan"]["version"] > version
        ),
    )
    info = st["pipelines"][1]["slow_stages"]
    assert info["factors"] == {"1": pytest.approx(1.3)} and info["solve_seconds"] > 0
    p0, p1 = st["plan"]["pipelines"]
    assert p1["frontier"] != "job" and p1["index"] == 0 and "slow stage" in p1["reason"]
    t_new = p1["time"]
    assert t_new == pytest.approx(info["time"]) and t_new > front["points"][0]["time"]
    # The healthy pipeline: least energy over an iteration of T' seconds, waiting included.
    cost = {
        i: pt["energy"] + BLOCKING_A40 * 2 * (t_new - pt["time"])
        for i, pt in enumerate(front["points"])
        if pt["time"] <= t_new * (1 + 1e-12)
    }
    assert p0["frontier"] == "job" and p0["index"] == min(cost, key=cost.__getitem__)
    assert any("slow stage" in r["why"] and "re-solved" in r["why"] for r in st["recent_replans"])

    # The slow rank receives its re-solved plan over WatchPlan.
    stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job, rank_id=ranks.ids[(1, 1)]), timeout=10)
    msg = next(stream)
    stream.cancel()
    assert msg.version == st["plan"]["version"]
    assert msg.expected_iteration_time == pytest.approx(t_new)
    assert len(msg.steps) == 2 * MICROBATCHES and "slow stage" in msg.reason

    metrics = http.get("/metrics").text
    assert f'perseus_replans_total{{perseus_job="{job}",reason="slow_stage"}}' in metrics
    assert "perseus_stage_resolve_seconds_count 1" in metrics

    # Recovery: three iterations at the profiled speed restore the default plan everywhere.
    version = st["plan"]["version"]
    ranks.report({}, version, n=3)
    st = _wait(http, job, lambda s: s["pipelines"][1]["slow_stages"] is None)
    assert [p["index"] for p in st["plan"]["pipelines"]] == [0, 0]
    assert all(p["frontier"] == "job" for p in st["plan"]["pipelines"])
    assert (
        f'perseus_replans_total{{perseus_job="{job}",reason="slow_stage_recovered"}}'
        in http.get("/metrics").text
    )

    # A pipeline slowed uniformly (every stage) is a slow pipeline, not a slow stage: no re-solve.
    version = st["plan"]["version"]
    ranks.report({(1, 0): 1.3, (1, 1): 1.3}, version, n=3)
    time.sleep(0.5)
    st = _status(http, job)
    assert st["pipelines"][1]["slow_stages"] is None
    assert "perseus_stage_resolve_seconds_count 1" in http.get("/metrics").text
    ranks.report({}, version, n=3)


def test_resolved_plan_survives_a_restart(tmp_path: Any, small_csv: str) -> None:
    with ServerProcess(tmp_path / "perseus.db") as srv:
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            job = solved_job(http, small_csv, data_parallel=2)
            channel = grpc.insecure_channel(srv.grpc_target)
            ranks = _Ranks(pb_grpc.PlanServiceStub(channel), job, small_csv)
            version = _status(http, job)["plan"]["version"]
            ranks.report({(0, 0): 1.5}, version, n=3)
            before = _wait(
                http, job, lambda s: (s["pipelines"][0]["slow_stages"] or {}).get("time")
            )["plan"]
            channel.close()
        srv.kill()
        srv.start()
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            after = _status(http, job)
        assert after["plan"]["version"] == before["version"]
        assert after["plan"]["pipelines"] == before["pipelines"]
        assert after["pipelines"][0]["slow_stages"]["factors"] == {"0": pytest.approx(1.5)}


def test_slow_stage_straggler_is_dropped_on_recovery_and_others_stay(
    tmp_path: Any, small_csv: str
) -> None:
    """A re-solved slow stage makes its pipeline a straggler of source ``slow stage``.

    The stage's recovery drops that straggler, while a straggler of another source on the
    pipeline stays.
    """
    with (
        ServerProcess(tmp_path / "perseus.db") as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        job = solved_job(http, small_csv, data_parallel=2)
        channel = grpc.insecure_channel(srv.grpc_target)
        ranks = _Ranks(pb_grpc.PlanServiceStub(channel), job, small_csv)

        def slow_stage_ready(version: int) -> dict[str, Any]:
            ranks.report({(1, 1): 1.3}, version, n=3)
            return _wait(
                http,
                job,
                lambda s: (
                    (s["pipelines"][1]["slow_stages"] or {}).get("status") == "ready"
                    and s["plan"]["version"] > version
                ),
            )

        st = slow_stage_ready(_status(http, job)["plan"]["version"])
        own = st["pipelines"][1]["slow_stages"]["time"]
        assert st["pipelines"][1]["straggler"] == {
            "time": pytest.approx(own),
            "source": "slow stage",
        }
        assert st["pipelines"][0]["straggler"] is None

        # Recovery drops the slow stage and its straggler: everyone back to the default plan.
        ranks.report({}, st["plan"]["version"], n=3)
        st = _wait(http, job, lambda s: s["pipelines"][1]["slow_stages"] is None)
        assert st["pipelines"][1]["straggler"] is None
        assert [p["index"] for p in st["plan"]["pipelines"]] == [0, 0]

        # Slow again, and reported slow by a cluster monitor meanwhile: the report replaces
        # the slow-stage straggler, and outlives the stage's recovery.
        st = slow_stage_ready(st["plan"]["version"])
        r = http.post(f"/jobs/{job}/stragglers", json={"pipeline": 1, "slowdown": 0.5})
        assert r.status_code == 200, r.text
        reported = r.json()["pipelines"][1]["straggler"]
        assert reported["source"] == "reported"
        ranks.report({}, r.json()["plan"]["version"], n=3)
        st = _wait(http, job, lambda s: s["pipelines"][1]["slow_stages"] is None)
        assert st["pipelines"][1]["straggler"] == reported
        p1 = st["plan"]["pipelines"][1]
        assert p1["frontier"] == "job" and p1["index"] == 0 and "reported" in p1["reason"]
        channel.close()


# --- the stage detector's pace-change rule ---------------------------------------------------


def _resolves(http: httpx.Client) -> int:
    """How many slow-stage re-solves the server has timed."""
    m = re.search(r"^perseus_stage_resolve_seconds_count (\S+)$", http.get("/metrics").text, re.M)
    return int(float(m.group(1))) if m else 0


def _feed(det: StageDetector, factors: list[float], current: float | None) -> list[object]:
    return [det.observe(0, 1, f, current)[0] for f in factors]


def test_stage_pace_change_rule() -> None:
    s = DetectorSettings(threshold=0.1, consecutive=3, recovery=0.02)
    # Slow by 1.5: three slow iterations flag it.
    det = StageDetector(s)
    assert _feed(det, [1.5, 1.5, 1.5], None) == [None, None, DetectorEvent.SLOW]
    # Known slow by 1.5, now 2.0 for three iterations: a changed pace, with the new mean.
    det = StageDetector(s)
    events = [det.observe(0, 1, f, 1.5) for f in (2.0, 2.0, 2.0)]
    assert events[-1] == (DetectorEvent.CHANGED, pytest.approx(2.0))
    # Within the threshold of the known factor: no change (1.6 / 1.5 - 1 < 0.1).
    det = StageDetector(s)
    assert _feed(det, [1.6, 1.6, 1.6, 1.6], 1.5) == [None] * 4
    # One iteration of the window back at the known pace: not every one is off, no change.
    det = StageDetector(s)
    assert _feed(det, [2.0, 1.5, 2.0], 1.5) == [None] * 3
    # Faster but still slow (1.5 -> 1.2): changed too, in either direction.
    det = StageDetector(s)
    assert _feed(det, [1.2, 1.2, 1.2], 1.5)[-1] is DetectorEvent.CHANGED
    # Back within recovery of the profile: recovered, not changed.
    det = StageDetector(s)
    assert _feed(det, [1.01, 1.0, 1.02], 1.5)[-1] is DetectorEvent.RECOVERED
    # Between recovery and threshold: neither slow (a change) nor recovered.
    det = StageDetector(s)
    assert _feed(det, [1.05, 1.05, 1.05], 1.5) == [None] * 3


def test_a_streak_that_starts_before_the_slowdown_is_measured_at_the_new_pace() -> None:
    """The factor flagged is the streak's median, not its mean.

    A loaded host held up the last iteration before a link slowed 4x by 20 %: the streak's
    first member is above the threshold, and a mean flagged 3.07x (the links demo's
    0.0092 s against 0.012 s).
    """
    s = DetectorSettings(threshold=0.05, consecutive=3, recovery=0.02)
    det = StageDetector(s)
    assert [det.observe(0, 0, f, None) for f in (1.2, 4.0, 4.1)][-1] == (
        DetectorEvent.SLOW,
        pytest.approx(4.0),
    )
    det = StageDetector(s)
    assert [det.observe(0, 0, f, 1.5) for f in (1.7, 3.0, 3.1)][-1] == (
        DetectorEvent.CHANGED,
        pytest.approx(3.0),
    )


def test_a_slow_stage_whose_pace_changes_is_resolved_again(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv, data_parallel=2)
    assert (
        http.put(
            f"/jobs/{job}/straggler-detection",
            json={"threshold": 0.05, "consecutive": 3, "recovery": 0.02},
        ).status_code
        == 200
    )
    ranks = _Ranks(stub, job, small_csv)
    version = _status(http, job)["plan"]["version"]
    resolves = _resolves(http)  # the module's server has re-solved other jobs' stages
    ranks.report({(1, 1): 1.3}, version, n=3)
    st = _wait(
        http,
        job,
        lambda s: (
            (s["pipelines"][1]["slow_stages"] or {}).get("status") == "ready"
            and s["plan"]["version"] > version
        ),
    )
    first = st["pipelines"][1]["slow_stages"]
    assert first["factors"] == {"1": pytest.approx(1.3)}
    t_first = st["plan"]["pipelines"][1]["time"]
    # The stage gets slower still: a new pace, a new re-solve with the new factor.
    version = st["plan"]["version"]
    ranks.report({(1, 1): 1.8}, version, n=3)
    st = _wait(
        http,
        job,
        lambda s: (
            (s["pipelines"][1]["slow_stages"] or {}).get("factors", {}).get("1", 0) > 1.5
            and s["pipelines"][1]["slow_stages"]["status"] == "ready"
            and s["plan"]["version"] > version
        ),
    )
    assert st["pipelines"][1]["slow_stages"]["factors"] == {"1": pytest.approx(1.8)}
    assert st["plan"]["pipelines"][1]["time"] > t_first
    assert _resolves(http) == resolves + 2


def test_drop_slow_stage_straggler_keeps_other_sources_and_pipelines() -> None:
    stragglers = {
        0: Straggler(0, 2.0, StragglerSource.SLOW_STAGE, "stage 1 x1.3"),
        1: Straggler(1, 2.5, StragglerSource.SLOW_STAGE, "stage 0 x1.5"),
        2: Straggler(2, 3.0, StragglerSource.REPORTED),
        3: Straggler(3, 3.5, StragglerSource.DETECTED),
    }
    assert drop_slow_stage_straggler(stragglers, 0) == {p: stragglers[p] for p in (1, 2, 3)}
    assert drop_slow_stage_straggler(stragglers, 2) == stragglers
    assert drop_slow_stage_straggler(stragglers, 3) == stragglers
