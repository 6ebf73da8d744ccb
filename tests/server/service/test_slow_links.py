"""Measured P2P transfers on the server.

Refused outside the physical bounds naming the field, kept per pipeline and link, and a link whose
transfer time grows is detected (status, metric), its pipeline's frontier re-solved with the
measured time (the server acting from the solved frontier meanwhile), and dropped when it recovers.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import grpc
import httpx
import pytest

from perseus.problem import EnergyProblem
from perseus.profiles import parse_profile_csv
from perseus.schedules import make_schedule
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_common.wire.codec import decode_report
from perseus_common.wire.values import IterationReport, TransferReport
from perseus_server import ServerProcess
from perseus_server.config import Limits
from perseus_server.domain.states import SlowStageStatus
from perseus_server.grpc.report_decoder import decode_report_columns
from perseus_server.runtime.solve_manager import SolveEvents
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.service.slow_stages import with_transfer_times

from ..conftest import BLOCKING_A40, register, solved_job
from ..sqlite_backend import JOB, RANK, first_release_database

MICROBATCHES = 4


@pytest.fixture(scope="module")
def job(http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str) -> dict[str, Any]:
    job_id = solved_job(http, small_csv, data_parallel=1)
    ranks = [register(stub, job_id, s, s).rank_id for s in (0, 1)]
    body = {"threshold": 0.05, "consecutive": 3, "recovery": 0.02}
    assert http.put(f"/jobs/{job_id}/straggler-detection", json=body).status_code == 200
    return {"id": job_id, "ranks": ranks, "it": itertools.count(1)}


def _report(job: dict[str, Any], version: int, rank: int, transfers: list[Any]) -> Any:
    return pb.IterationReport(
        job_id=job["id"],
        rank_id=job["ranks"][rank],
        iteration=next(job["it"]),
        iteration_time=1.0,
        plan_version=version,
        transfers=transfers,
    )


def _transfers(times: dict[tuple[int, str], float]) -> list[Any]:
    return [
        pb.TransferMeasurement(boundary=b, direction=d, microbatch=m, time=t)
        for (b, d), t in times.items()
        for m in range(MICROBATCHES)
    ]


def _status(http: httpx.Client, job: dict[str, Any]) -> dict[str, Any]:
    return dict(http.get(f"/jobs/{job['id']}/status").json())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"time": math.nan}, "transfers.time"),
        ({"time": math.inf}, "transfers.time"),
        ({"time": -1.0}, "transfers.time"),
        ({"time": 0.0}, "transfers.time"),
        ({"time": 1.000001e6}, "transfers.time"),
        ({"boundary": 1}, "transfers.boundary"),  # two stages: boundary 0 only
        ({"boundary": -1}, "transfers.boundary"),
        ({"direction": "sideways"}, "transfers.direction"),
        ({"microbatch": MICROBATCHES}, "transfers.microbatch"),
    ],
)
def test_a_transfer_outside_its_bounds_is_refused_naming_the_field(
    http: httpx.Client,
    stub: pb_grpc.PlanServiceStub,
    job: dict[str, Any],
    change: dict[str, Any],
    field: str,
) -> None:
    good = {"boundary": 0, "direction": "forward", "microbatch": 0, "time": 0.002}
    version = _status(http, job)["plan"]["version"]
    bad = pb.TransferMeasurement(**{**good, **change})
    rep = _report(job, version, 0, [pb.TransferMeasurement(**good), bad])
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportIterations(iter([rep]), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field + ":"), e.value.details()
    assert "transfers[1]" in e.value.details()


def test_both_decoders_read_the_same_transfers() -> None:
    msg = pb.IterationReport(
        job_id="j",
        rank_id="r",
        iteration=1,
        iteration_time=1.0,
        transfers=_transfers({(0, "forward"): 0.002, (1, "backward"): 0.004}),
    )
    small, large = decode_report(msg), decode_report_columns(msg)
    assert small.transfers == large.transfers and len(small.transfers) == 2 * MICROBATCHES
    assert small.transfers[-1].direction == "backward" and small.transfers[-1].time == 0.004


def _wait(http: httpx.Client, job: dict[str, Any], pred: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        st = _status(http, job)
        if pred(st):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached: {st}")
        time.sleep(0.1)


def _slow_link_series(http: httpx.Client) -> list[str]:
    return [
        line
        for line in http.get("/metrics").text.splitlines()
        if line.startswith("perseus_slow_link{")
    ]


def test_a_slowed_link_is_named_replanned_with_its_time_and_recovers(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, job: dict[str, Any], small_csv: str
) -> None:
    base = {(0, "forward"): 0.002, (0, "backward"): 0.003}
    st = _status(http, job)
    version = st["plan"]["version"]
    t0 = st["plan"]["pipelines"][0]["time"]

    def iterate(times: dict[tuple[int, str], float], n: int) -> None:
        for _ in range(n):
            # stage 0 times the forward sends, stage 1 the backward ones (as the hooks do)
            reps = [
                _report(job, version, 0, _transfers({(0, "forward"): times[(0, "forward")]})),
                _report(job, version, 1, _transfers({(0, "backward"): times[(0, "backward")]})),
            ]
            stub.ReportIterations(iter(reps), timeout=30)

    # The profile has no communication: the first window is the baseline.
    iterate(base, 4)
    st = _status(http, job)
    links = {(x["boundary"], x["direction"]): x for x in st["pipelines"][0]["links"]}
    assert links[(0, "forward")]["time"] == pytest.approx(0.002)
    assert links[(0, "forward")]["baseline"] == pytest.approx(0.002)
    assert links[(0, "backward")]["baseline"] == pytest.approx(0.003)
    assert st["pipelines"][0]["slow_links"] == [] and _slow_link_series(http) == []

    # Jitter: the link takes 1.5 times its baseline (past the 5 % threshold), but the excess
    # is under 5 % of its sender's step (stage 0's forward): not a slow link, no re-solve.
    forward = float(parse_profile_csv(small_csv).entries[(0, "forward")].times.min())
    jitter = 0.002 * 1.5
    assert jitter - 0.002 < 0.05 * forward and jitter / 0.002 > 1.05
    iterate({**base, (0, "forward"): jitter}, 4)
    st = _status(http, job)
    assert st["pipelines"][0]["slow_links"] == [] and st["plan"]["version"] == version
    assert st["pipelines"][0]["slow_stages"] is None
    iterate(base, 3)  # the detector's window back at the baseline

    slowed = {**base, (0, "forward"): 0.05}  # the link now takes 25 times as long
    iterate(slowed, 2)
    assert _status(http, job)["pipelines"][0]["slow_links"] == []  # 2 iterations: not yet
    iterate(slowed, 1)
    st = _wait(
        http,
        job,
        lambda s: (
            (s["pipelines"][0]["slow_stages"] or {}).get("status") == "ready"
            and s["plan"]["version"] > version
        ),
    )
    (slow,) = st["pipelines"][0]["slow_links"]
    assert (slow["boundary"], slow["direction"]) == (0, "forward")
    assert slow["time"] == pytest.approx(0.05) and slow["factor"] == pytest.approx(25)
    info = st["pipelines"][0]["slow_stages"]
    assert info["factors"] == {}
    assert info["links"] == [{"boundary": 0, "direction": "forward", "time": pytest.approx(0.05)}]
    assert any("link 0 forward" in r["why"] for r in st["recent_replans"])
    (series,) = _slow_link_series(http)
    assert 'boundary="0"' in series and 'direction="forward"' in series
    assert f'perseus_job="{job["id"]}"' in series and series.endswith(" 1")
    # The re-solve used the profile with the measured transfer time: its fastest plan takes what
    # the model gives that profile at the maximum clocks, later than the compute-only plan.
    profile = with_transfer_times(parse_profile_csv(small_csv), {(0, "forward"): 0.05})
    problem = EnergyProblem.build(profile, make_schedule("1f1b", 2, MICROBATCHES), BLOCKING_A40)
    t_max = problem.evaluate(problem.max_frequency_plan()).time
    assert info["time"] == pytest.approx(t_max, rel=1e-6) and info["time"] > t0 * 1.01
    html = http.get("/ui").text
    assert html  # the page itself renders the status client-side (app.js names slow links)
    assert "slow_links" in http.get("/ui/app.js").text

    iterate(base, 3)  # back to its baseline
    st = _wait(http, job, lambda s: s["pipelines"][0]["slow_stages"] is None)
    assert st["pipelines"][0]["slow_links"] == [] and _slow_link_series(http) == []
    assert any("back to their profiled speed" in r["why"] for r in st["recent_replans"])


def test_a_slow_links_resolve_survives_a_restart_and_respects_the_dwell(
    tmp_path: Any, small_csv: str
) -> None:
    base = {(0, "forward"): 0.002, (0, "backward"): 0.003}
    slowed = {**base, (0, "forward"): 0.05}
    with ServerProcess(tmp_path / "perseus.db", extra_args=["--replan-dwell", "600"]) as srv:

        def run(job: dict[str, Any], times: dict[tuple[int, str], float], n: int) -> None:
            channel = grpc.insecure_channel(srv.grpc_target)
            stub = pb_grpc.PlanServiceStub(channel)
            version = _status(http, job)["plan"]["version"]
            for _ in range(n):
                reps = [
                    _report(job, version, 0, _transfers({(0, "forward"): times[(0, "forward")]})),
                    _report(job, version, 1, _transfers({(0, "backward"): times[(0, "backward")]})),
                ]
                stub.ReportIterations(iter(reps), timeout=30)
            channel.close()

        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            job_id = solved_job(http, small_csv, data_parallel=1)
            channel = grpc.insecure_channel(srv.grpc_target)
            stub = pb_grpc.PlanServiceStub(channel)
            ranks = [register(stub, job_id, s, s).rank_id for s in (0, 1)]
            channel.close()
            job = {"id": job_id, "ranks": ranks, "it": itertools.count(1)}
            run(job, base, 4)
            run(job, slowed, 3)
            before = _wait(
                http,
                job,
                lambda s: (s["pipelines"][0]["slow_stages"] or {}).get("status") == "ready",
            )
        srv.kill()
        srv.start()
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            after = _status(http, job)
            assert after["plan"]["pipelines"] == before["plan"]["pipelines"]
            assert after["pipelines"][0]["slow_stages"]["links"] == [
                {"boundary": 0, "direction": "forward", "time": pytest.approx(0.05)}
            ]
            # The restarted server keeps the link's baseline (its first window, stored).
            run(job, base, 4)  # recovered: no dwell after a restart, the re-solve is dropped
            st = _wait(http, job, lambda s: s["pipelines"][0]["slow_stages"] is None)
            assert st["pipelines"][0]["slow_links"] == []
            # Slow again right after that replan: detected and shown, but the pipeline dwells.
            run(job, slowed, 3)
            st = _wait(http, job, lambda s: s["pipelines"][0]["slow_links"] != [])
            time.sleep(0.5)
            st = _status(http, job)
            assert st["pipelines"][0]["slow_stages"] is None  # no re-solve within the dwell
            assert [(x["boundary"], x["direction"]) for x in st["pipelines"][0]["slow_links"]] == [
                (0, "forward")
            ]


def test_both_ends_of_a_link_give_the_transfer_itself(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    """The link's time is, per microbatch, the smaller of its two ends' times.

    Each end of a transfer measures it plus its wait for the other end (as the integrations time
    them): the link's time is, per microbatch, the smaller of the two.
    """
    job_id = solved_job(http, small_csv, data_parallel=1)
    ranks = [register(stub, job_id, s, s).rank_id for s in (0, 1)]
    job = {"id": job_id, "ranks": ranks, "it": itertools.count(1)}
    version = _status(http, job)["plan"]["version"]
    true = 0.002
    for i in range(5):
        # Each end waited on half the microbatches (each end's own median: 7 ms), never both.
        late0 = {i % MICROBATCHES, (i + 1) % MICROBATCHES}
        for rank in (0, 1):
            late = late0 if rank == 0 else set(range(MICROBATCHES)) - late0
            times = [true + (0.01 if m in late else 0.0) for m in range(MICROBATCHES)]
            rep = pb.IterationReport(
                job_id=job_id,
                rank_id=ranks[rank],
                iteration=i,
                iteration_time=1.0,
                plan_version=version,
                transfers=[
                    pb.TransferMeasurement(boundary=0, direction="forward", microbatch=m, time=t)
                    for m, t in enumerate(times)
                ],
            )
            stub.ReportIterations(iter([rep]), timeout=30)
    (link,) = _status(http, job)["pipelines"][0]["links"]
    assert link["time"] == pytest.approx(true) and link["iterations"] == 5


class _HeldSolver:
    """The service's solve manager with every re-solve held back.

    Started, never finished until the test releases it (``events``).
    """

    def __init__(self) -> None:
        self.events: dict[str, SolveEvents] = {}

    def start(self, key: str, profile_csv: str, *args: Any, tenant: str | None = None) -> None:
        self.events[key] = args[-1]

    def is_active(self, key: str) -> bool:
        return key in self.events

    def cancel(self, key: str, reason: str = "") -> bool:
        return self.events.pop(key, None) is not None


def test_a_slow_link_deploys_from_the_solved_frontier_before_its_resolve(
    tmp_path: Any, small_csv: str
) -> None:
    """A detected slow link deploys from the solved frontier before its re-solve.

    Detected, a slow link moves the other pipeline at once, from the job's frontier, to follow
    the slowed one as it follows a straggler (its time: the plan's plus the link's excess per
    microbatch), while the re-solve is held back; the re-solve, once done, replaces it.
    """
    found = first_release_database(tmp_path / "perseus.db", small_csv)
    store = SqlStore.open(tmp_path / "perseus.db")
    try:
        svc = PerseusService(store, Limits(replan_dwell_seconds=0.0))
        svc.load()
        held = _HeldSolver()
        svc.ctx.solver = held  # type: ignore[assignment]
        svc.stragglers.clear(JOB, None)  # the stored straggler: none left
        job = svc.jobs.get(JOB)
        frontier = found["frontier"]
        assert list(job.deployment.current.indices) == [0, 0]  # type: ignore[union-attr]
        (slow_links,) = [o for o in svc.reports.observers if type(o).__name__ == "SlowLinks"]
        its = itertools.count(100)

        def iterate(t: float, n: int) -> None:
            for _ in range(n):
                version = job.deployment.version
                rep = IterationReport(
                    job_id=JOB,
                    rank_id=RANK,
                    iteration=next(its),
                    iteration_time=1.0,
                    plan_version=version,
                    transfers=tuple(TransferReport(0, "forward", m, t) for m in range(4)),
                )
                slow_links.observe(svc.reports.check(0, rep))

        iterate(0.002, 3)  # the baseline: the profile has no transfer times
        version = job.deployment.version
        iterate(0.05, 3)  # slow for `consecutive` iterations: detected
        assert set(held.events) == {f"{JOB}:pipeline0"}  # its re-solve started, held back
        state = job.stragglers.slow_stages[0]
        assert state.status is SlowStageStatus.SOLVING and state.frontier is None
        # Deployed from the solved frontier: pipeline 0 a straggler of its plan's time plus the
        # link's excess once per microbatch, pipeline 1 slowed to match it.
        dep = job.deployment.current
        assert dep is not None and job.deployment.version == version + 1
        t_prime = float(frontier.times[0]) + 4 * (0.05 - 0.002)
        assert job.stragglers.stragglers[0].time == pytest.approx(t_prime)
        assert dep.indices[0] == 0 and dep.own == ()
        assert dep.indices[1] == frontier.index_for_deadline(t_prime, wait=True) > 0
        assert "slowed to match straggler pipeline 0" in dep.reasons[1]
        assert "acting from the solved frontier" in job.stragglers.replans[-1]["why"]
        iterate(0.05, 3)  # still slow, nothing new: no further version
        assert job.deployment.version == version + 1
        # The re-solve is done: pipeline 0 runs its re-solved frontier's fastest plan.
        resolved = frontier  # (any frontier: what it deploys is what matters here)
        held.events.pop(f"{JOB}:pipeline0").on_done("{}", 0.1, resolved)
        dep = job.deployment.current
        assert dep is not None and job.deployment.version == version + 2 and dep.own == (0,)
        assert "frontier re-solved" in job.stragglers.replans[-1]["why"]
    finally:
        store.close()


def test_a_link_slowed_in_every_pipeline_alike_is_the_hosts_not_a_slow_link(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    """A host that holds up every rank delays a link in every pipeline: nobody's slow link.

    Each pipeline's link is compared with the same link in the other pipelines (their common
    mode), as a straggler is with the healthiest pipeline: on a loaded machine the demo's
    pipelines were flagged by turns, and each flag re-solved a healthy pipeline. The same
    slowdown in one pipeline alone is still a slow link.
    """
    job_id = solved_job(http, small_csv, data_parallel=2)
    body = {"threshold": 0.05, "consecutive": 3, "recovery": 0.02}
    assert http.put(f"/jobs/{job_id}/straggler-detection", json=body).status_code == 200
    job = {
        "id": job_id,
        "ranks": [register(stub, job_id, 2 * p, 0, p).rank_id for p in (0, 1)],
        "it": itertools.count(1),
    }
    version = _status(http, job)["plan"]["version"]
    link = (0, "forward")

    def iterate(times: tuple[float, float], n: int) -> dict[str, Any]:
        for _ in range(n):
            reps = [_report(job, version, p, _transfers({link: times[p]})) for p in (0, 1)]
            stub.ReportIterations(iter(reps), timeout=30)
        return _status(http, job)

    iterate((0.002, 0.002), 4)  # the baselines
    st = iterate((0.05, 0.05), 6)  # both pipelines' link 25 times slower, together
    assert [p["slow_links"] for p in st["pipelines"]] == [[], []]
    assert st["plan"]["version"] == version
    assert all(p["slow_stages"] is None for p in st["pipelines"])
    iterate((0.002, 0.002), 4)
    iterate((0.002, 0.05), 3)  # pipeline 1's alone
    st = _wait(http, job, lambda s: s["pipelines"][1]["slow_links"] != [])
    (slow,) = st["pipelines"][1]["slow_links"]
    assert (slow["boundary"], slow["direction"]) == link
    assert slow["time"] == pytest.approx(0.05)
    assert st["pipelines"][0]["slow_links"] == []
