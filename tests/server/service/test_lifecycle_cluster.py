"""A shared cluster's server (issue 24).

Jobs' lifecycles and the power budget that follows them, profile mismatches and the replan dwell,
the metrics an operator alerts on (parsed with prometheus_client's parser), the small doors
(blocking power, ``?stages=``), token rotation.

Everything runs against real ``perseus serve`` processes over real gRPC streams.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from perseus.profiles import parse_profile_csv
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

from ..conftest import problem_field, register, sliced_profile_csv, solved_job

IDLE_AFTER = 3.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = tmp_path_factory.mktemp("db") / "perseus.db"
    args = ["--idle-after", str(IDLE_AFTER), "--replan-dwell", "30"]
    with ServerProcess(db, extra_args=args) as s:
        yield s


@pytest.fixture(scope="module")
def http(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.http_url, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def stub(srv: ServerProcess) -> Iterator[pb_grpc.PlanServiceStub]:
    with grpc.insecure_channel(srv.grpc_target) as ch:
        yield pb_grpc.PlanServiceStub(ch)


def _until(what: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.1)


def _connect(stub: pb_grpc.PlanServiceStub, job: str) -> Any:
    """Register the job's two ranks (it can run) and open rank 0's plan stream (first plan read)."""
    rank = register(stub, job, 0, 0).rank_id
    register(stub, job, 1, 1)
    stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=job, rank_id=rank), timeout=600)
    next(stream)
    return stream


def _metrics(http: httpx.Client) -> dict[str, Any]:
    """Every family of ``/metrics`` by name, parsed by prometheus_client's parser."""
    return {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}


def _samples(fam: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in fam.samples}


def _shares(http: httpx.Client) -> dict[str, float]:
    return {j["id"]: j["watts"] for j in http.get("/power-budget").json()["jobs"]}


def test_budget_follows_the_jobs_that_run(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    """Three jobs share a budget; one finishes, one goes idle, one joins.

    After each step the watts go to the active jobs only, within the budget's recompute interval
    (changes within half a second of the last are merged), and the metrics and status say so.
    """
    a, b, c = (solved_job(http, small_csv, name=n) for n in "abc")
    streams = {j: _connect(stub, j) for j in (a, b, c)}
    r = http.put("/power-budget", json={"watts": 1e6})
    assert r.status_code == 200, r.text
    fastest = _shares(http)
    lowest = r.json()["lowest_power"] / 3  # the three jobs are alike
    watts = 3 * lowest + 0.5 * (sum(fastest.values()) - 3 * lowest)
    r = http.put("/power-budget", json={"watts": watts})
    step1 = _shares(http)
    assert set(step1) == {a, b, c} and sum(step1.values()) <= watts * (1 + 1e-9)

    # a finishes: b and c share the whole budget (each gets more).
    fin = http.post(f"/jobs/{a}/finish")
    assert fin.status_code == 200 and fin.json()["state"] == "finished", fin.text
    assert http.post(f"/jobs/{a}/finish").status_code == 409
    step2 = _until(lambda: set(s := _shares(http)) == {b, c} and s)
    assert all(step2[j] > step1[j] for j in (b, c))
    assert http.get("/power-budget").json()["left_out"] == [
        {"job": a, "why": "not active (idle or finished)"}
    ]
    assert http.get(f"/jobs/{a}/status").json()["power_budget"] is None

    # b's rank leaves: b is idle after IDLE_AFTER seconds and c has the budget alone.
    streams[b].cancel()
    st = _until(lambda: (s := http.get(f"/jobs/{b}").json())["lifecycle"]["state"] == "idle" and s)
    assert st["lifecycle"]["reason"] == f"no rank connected for {IDLE_AFTER:g} s"
    step3 = _until(lambda: set(s := _shares(http)) == {c} and s)
    assert step3[c] >= step2[c]

    # d joins (its rank connects): c and d share it.
    d = solved_job(http, small_csv, name="d")
    streams[d] = _connect(stub, d)
    step4 = _until(lambda: set(s := _shares(http)) == {c, d} and s)
    assert sum(step4.values()) <= watts * (1 + 1e-9)

    m = _metrics(http)
    assert _samples(m["perseus_power_budget_watts"]) == {(): pytest.approx(watts)}
    assert _samples(m["perseus_power_budget_feasible"]) == {(): 1.0}
    alloc = _samples(m["perseus_power_budget_allocation_watts"])
    assert alloc == {(("perseus_job", j),): pytest.approx(w) for j, w in step4.items()}
    connected = _samples(m["perseus_connected_ranks"])
    assert connected[(("perseus_job", a),)] == 1 and connected[(("perseus_job", b),)] == 0
    life = _samples(m["perseus_job_lifecycle"])
    assert life[(("perseus_job", a), ("state", "finished"))] == 1
    assert life[(("perseus_job", b), ("state", "idle"))] == 1
    assert life[(("perseus_job", d), ("state", "active"))] == 1
    print(
        "budget", round(watts, 1), "W; step1", step1, "step2", step2, "step3", step3, "step4", step4
    )

    # b's rank comes back: b is active again and rejoins the budget.
    streams[b] = _connect(stub, b)
    assert http.get(f"/jobs/{b}").json()["lifecycle"]["state"] == "active"
    _until(lambda: set(_shares(http)) == {b, c, d})

    # A budget that cannot be met: with keep_current, b, c and d keep their plans when e
    # joins (3.5 least-power plans' worth of watts: enough for three jobs, not for four).
    per_job = http.get("/power-budget").json()["lowest_power"] / 3
    r = http.put("/power-budget", json={"watts": 3.5 * per_job, "on_infeasible": "keep_current"})
    assert r.status_code == 200 and r.json()["feasible"], r.text
    kept = _shares(http)
    assert all(w > per_job * 1.01 for w in kept.values())
    e = solved_job(http, small_csv, name="e")
    streams[e] = _connect(stub, e)
    view = _until(lambda: e in _shares(http) and http.get("/power-budget").json())
    assert not view["feasible"] and view["on_infeasible"] == "keep_current"
    assert view["over_by"] == pytest.approx(0.5 * per_job)
    now = _shares(http)
    assert {j: now[j] for j in kept} == kept and now[e] == pytest.approx(per_job)
    assert _samples(_metrics(http)["perseus_power_budget_feasible"]) == {(): 0.0}
    assert http.get(f"/jobs/{e}/status").json()["power_budget"]["feasible"] is False
    print("keep_current: kept", kept, "then", now)
    for s in streams.values():
        s.cancel()


def test_metrics_follow_the_naming_conventions(http: httpx.Client, small_csv: str) -> None:
    """The metrics follow the naming conventions, parsed with prometheus_client.

    ``_total`` only on counters, units in the names, and every job exports its connected ranks
    (0 included) and world size.
    """
    job = solved_job(http, small_csv, name="metrics")
    fams = _metrics(http)
    for name, fam in fams.items():
        if fam.type == "counter":
            assert all(s.name == name + "_total" for s in fam.samples), name
        else:
            assert not name.endswith("_total"), f"{name} is a {fam.type} named like a counter"
        if fam.type == "histogram":
            assert name.endswith("_seconds"), name
    for name in ("perseus_energy_saved_joules", "perseus_job_power_watts"):
        assert fams[name].type == "gauge"
    assert fams["perseus_start_time_seconds"].samples[0].value > 1.7e9
    jobs = [j["id"] for j in http.get("/jobs").json()["jobs"]]
    connected = _samples(fams["perseus_connected_ranks"])
    world = _samples(fams["perseus_job_world_size"])
    for j in jobs:
        assert (("perseus_job", j),) in connected and world[(("perseus_job", j),)] >= 1
    assert connected[(("perseus_job", job),)] == 0
    slow = _samples(fams["perseus_deployed_slowdown_ratio"])
    # The deployed point's time over the fastest one, minus 1 (0 for the default fastest plan;
    # more when a power budget another test left on this shared server covers the job).
    st = http.get(f"/jobs/{job}/status").json()
    front = http.get(f"/jobs/{job}/frontier").json()["points"]
    index = st["plan"]["pipelines"][0]["index"]
    want = front[index]["time"] / front[0]["time"] - 1
    assert slow[(("perseus_job", job), ("pipeline", "0"))] == pytest.approx(
        want, rel=1e-9, abs=1e-12
    )
    deploys = _samples(fams["perseus_plan_deployments"])
    assert deploys[(("kind", "plan"), ("perseus_job", job))] >= 1
    les = {s.labels["le"] for s in fams["perseus_solve_seconds"].samples if "le" in s.labels}
    assert max(float(le) for le in les) == float("inf")
    assert max(float(le) for le in les - {"+Inf"}) == 3600  # the solve limit has a bucket


def test_a_profile_that_does_not_describe_the_job_is_flagged(
    http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    """A profile that does not describe the job is flagged.

    Iterations at 2 % of the plan's time: profile_mismatch, energy saved withheld, no replan
    (the issue's 93 plan versions in 90 s); a straggler's detection is not held back by it once
    the profile matches, but its recovery waits for the dwell (30 s here).
    """
    job = solved_job(http, small_csv, data_parallel=2, name="mismatch")
    ranks = {d: register(stub, job, d * 2, 0, data_rank=d).rank_id for d in (0, 1)}
    st = http.get(f"/jobs/{job}/status").json()
    version, t_plan = st["plan"]["version"], st["plan"]["pipelines"][0]["time"]
    it = iter(range(10_000))

    def report(d: int, times: list[float], v: int) -> None:
        stub.ReportIterations(
            iter(
                pb.IterationReport(job_id=job, rank_id=ranks[d], iteration=next(it),
                                   iteration_time=t, energy=t * 200, plan_version=v)
                for t in times
            ),
            timeout=10,
        )  # fmt: skip

    report(0, [t_plan * 0.02] * 10, version)
    report(1, [t_plan * 0.03] * 10, version)  # 1.5x the other: a "straggler" on a wrong profile
    st = http.get(f"/jobs/{job}/status").json()
    mm = st["profile_mismatch"]
    assert mm is not None and mm["ratio"] == pytest.approx(0.02)
    assert "online profiling" in mm["reason"]
    assert st["plan"]["version"] == version and not st["recent_replans"]
    assert st["measured"]["energy_saved"] is None and "profile" in st["measured"]["withheld"]
    fams = _metrics(http)
    assert _samples(fams["perseus_profile_mismatch"])[(("perseus_job", job),)] == 1
    assert (("perseus_job", job),) not in _samples(fams["perseus_energy_saved_joules"])

    # Back at the plan's pace: the mismatch clears; a real straggler is detected at once...
    report(0, [t_plan] * 8, version)
    report(1, [t_plan] * 8, version)
    assert http.get(f"/jobs/{job}/status").json()["profile_mismatch"] is None
    report(1, [t_plan * 1.3] * 3, version)
    st = http.get(f"/jobs/{job}/status").json()
    assert st["plan"]["version"] == version + 1 and st["pipelines"][1]["straggler"] is not None
    # ... and its recovery moments later waits out the dwell: no version every few iterations.
    report(0, [t_plan] * 6, version + 1)
    report(1, [t_plan] * 6, version + 1)
    st = http.get(f"/jobs/{job}/status").json()
    assert st["plan"]["version"] == version + 1 and st["pipelines"][1]["straggler"] is not None
    replans = _samples(_metrics(http)["perseus_replans"])
    assert {k: v for k, v in replans.items() if ("perseus_job", job) in k} == {
        (("perseus_job", job), ("reason", "detected")): 1
    }


def test_unknown_gpu_needs_blocking_power_and_profiles_take_stages(
    http: httpx.Client, small_csv: str
) -> None:
    before = len(http.get("/jobs").json()["jobs"])
    r = http.post("/jobs", json={"stages": 2, "microbatches": 4, "gpu_model": "NVIDIA H100"})
    assert r.status_code == 422 and problem_field(r) == "blocking_power"
    assert "nvidia-smi" in r.json()["detail"] and "online profiling" in r.json()["detail"]
    # Neither a blocking power nor a GPU model: refused too, never a silent 0 W ...
    r = http.post("/jobs", json={"stages": 2, "microbatches": 4})
    assert r.status_code == 422 and problem_field(r) == "blocking_power"
    assert "nvidia-smi" in r.json()["detail"] and "online profiling" in r.json()["detail"]
    # ... but a bad field elsewhere is named first, and 0 W given explicitly is taken.
    r = http.post("/jobs", json={"stages": 2, "microbatches": 4, "data_parallel": 100000})
    assert r.status_code == 422 and problem_field(r) == "data_parallel"
    assert len(http.get("/jobs").json()["jobs"]) == before
    r = http.post("/jobs", json={"stages": 2, "microbatches": 4, "blocking_power": 0})
    assert r.status_code == 201 and r.json()["blocking_power"] == 0
    http.delete(f"/jobs/{r.json()['id']}")
    r = http.post("/jobs", json={"stages": 2, "microbatches": 4, "gpu_model": "NVIDIA A100 SXM"})
    assert r.status_code == 201 and r.json()["blocking_power"] == pytest.approx(83.64)
    job = r.json()["id"]
    four = sliced_profile_csv(stages=4)
    r = http.put(f"/jobs/{job}/profile", content=four, headers={"content-type": "text/csv"})
    assert r.status_code == 422  # four stages for a two-rank job
    for bad in ("0-4", "x", "1,1"):
        r = http.put(
            f"/jobs/{job}/profile",
            params={"stages": bad},
            content=four,
            headers={"content-type": "text/csv"},
        )
        assert r.status_code == 422 and problem_field(r) == "stages", (bad, r.text)
    r = http.put(
        f"/jobs/{job}/profile",
        params={"stages": "2-3"},
        content=four,
        headers={"content-type": "text/csv"},
    )
    assert r.status_code == 200 and r.json()["stages"] == 2, r.text
    stored = http.get(f"/jobs/{job}/profile", params={"format": "json"}).json()
    assert stored == parse_profile_csv(four).select_stages([2, 3]).to_json()


def test_admin_token_rotates_on_sighup(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "perseus.db", token="old-token-0123456789") as s:
        token_file = Path(s._tmp.name) / "token"  # where ServerProcess wrote --token-file
        assert httpx.get(s.http_url + "/jobs", headers=s.headers).status_code == 200
        token_file.write_text("new-token-9876543210\n")
        os.kill(s.pid, signal.SIGHUP)
        new = {"Authorization": "Bearer new-token-9876543210"}
        _until(lambda: httpx.get(s.http_url + "/jobs", headers=new).status_code == 200)
        assert httpx.get(s.http_url + "/jobs", headers=s.headers).status_code == 401
        # A file that cannot be used (other users may read it) keeps the current token.
        token_file.write_text("third-token-000000000\n")
        token_file.chmod(0o644)
        os.kill(s.pid, signal.SIGHUP)
        _until(lambda: "token files not reloaded" in s.output())
        assert httpx.get(s.http_url + "/jobs", headers=new).status_code == 200


def test_lifecycles_survive_a_restart(tmp_path: Path) -> None:
    """A finished job stays finished across a restart.

    An active one without ranks gets the idle timeout again from the server's start, then is
    idle (stored too).
    """
    db = tmp_path / "perseus.db"
    body = {"stages": 2, "microbatches": 4, "blocking_power": 70.0}
    with ServerProcess(db) as s, httpx.Client(base_url=s.http_url) as c:
        done, waiting = (c.post("/jobs", json=body).json()["id"] for _ in range(2))
        assert c.post(f"/jobs/{done}/finish").json()["reason"] == "finished on request"
        assert c.get(f"/jobs/{waiting}").json()["lifecycle"]["state"] == "active"
    with (
        ServerProcess(db, extra_args=["--idle-after", "1"]) as s,
        httpx.Client(base_url=s.http_url) as c,
    ):
        assert c.get(f"/jobs/{done}").json()["lifecycle"]["state"] == "finished"
        _until(lambda: c.get(f"/jobs/{waiting}").json()["lifecycle"]["state"] == "idle")
    with ServerProcess(db) as s, httpx.Client(base_url=s.http_url) as c:
        jobs = {j["id"]: j["lifecycle"]["state"] for j in c.get("/jobs").json()["jobs"]}
        assert jobs == {done: "finished", waiting: "idle"}


def test_a_job_whose_ranks_all_exit_cleanly_is_finished(tmp_path: Path) -> None:
    """Two real clients (``with PerseusClient``, simulated GPUs) end without an exception.

    Each sends FinishRank, and the job is finished once both did; a rank credential may not
    finish another job's rank.
    """
    from perseus_client import PerseusClient, RankPosition, SimulatedGpu

    profile = {
        (s, k): {1410: (0.01, 3.0), 1200: (0.012, 2.6)} for s in (0, 1) for k in ("forward",
                                                                                 "backward")
    }  # fmt: skip
    with (
        ServerProcess(tmp_path / "perseus.db", token="admin-token-0123456789") as s,
        httpx.Client(base_url=s.http_url, headers=s.headers) as c,
    ):
        created = c.post(
            "/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0}
        ).json()
        job, secret = created["id"], created["rank_credential"]
        other = c.post(
            "/jobs", json={"stages": 2, "microbatches": 2, "blocking_power": 70.0}
        ).json()["id"]
        clients = [
            PerseusClient(s.grpc_target, job, token=secret, gpu=SimulatedGpu(profile, stage=r,
                          time_scale=0), handle_signals=False, rank=RankPosition(global_rank=r, pipeline_rank=r))
            for r in (0, 1)
        ]  # fmt: skip
        _until(lambda: c.get(f"/jobs/{job}/status").json()["connected_ranks"] == 2)
        with clients[0]:
            pass  # a clean exit: FinishRank
        st = c.get(f"/jobs/{job}").json()["lifecycle"]
        assert st["state"] == "active"  # one of two ranks finished
        with grpc.insecure_channel(s.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            rank1 = _until(
                lambda: [r["rank_id"] for r in c.get(f"/jobs/{job}/status").json()["ranks"]
                         if r["global_rank"] == 1]
            )[0]  # fmt: skip
            with pytest.raises(grpc.RpcError) as refused:
                stub.FinishRank(
                    pb.FinishRankRequest(job_id=other, rank_id=rank1),
                    metadata=(("authorization", f"Bearer {secret}"),),
                    timeout=10,
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(RuntimeError), clients[1]:
            raise RuntimeError("training crashed")  # not a clean exit: no FinishRank
        assert c.get(f"/jobs/{job}").json()["lifecycle"]["state"] == "active"
        with grpc.insecure_channel(s.grpc_target) as ch:
            resp = pb_grpc.PlanServiceStub(ch).FinishRank(
                pb.FinishRankRequest(job_id=job, rank_id=rank1),
                metadata=(("authorization", f"Bearer {secret}"),),
                timeout=10,
            )
        assert resp.job_finished and (resp.ranks_finished, resp.ranks_registered) == (2, 2)
        life = c.get(f"/jobs/{job}").json()["lifecycle"]
        assert life["state"] == "finished" and life["reason"] == "all 2 rank(s) finished cleanly"
