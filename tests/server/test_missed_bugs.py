"""Four behaviours no test pinned down, found by seeding bugs the suite did not catch (each test
here fails on a version with its bug; see the report of the change that added them):

- with stragglers of different speeds, every other pipeline is slowed to the *slowest*
  straggler's time, whatever order the stragglers are held in (the planner, three or more
  pipelines);
- within one ``ReportIterations`` stream, a report whose sequence repeats, or falls below one
  already sent, is acknowledged as a duplicate and stored once (real gRPC stream, real store);
- a database written by the first release keeps its finished frontier finished: migrating it
  marks no frontier partial (real server on a first-release file);
- paging ``GET /jobs`` gives no ``next`` cursor on a page that ends exactly at the last job
  (real server, known number of jobs).
"""

from __future__ import annotations

import math
import re
from itertools import permutations
from pathlib import Path

import httpx
import pytest

from perseus.frontier import Frontier
from perseus.profiles import Profile
from perseus.schedules import one_f_one_b
from perseus.solver import solve_frontier
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.decisions.planner import PlanPolicy, Straggler, decide
from perseus_server.domain.states import StragglerSource
from perseus_server.runtime.sqlite_store import SqliteStore

from .conftest import make_job, register, solved_job
from .sqlite_backend import JOB, connect, first_release_database

P_A100 = 83.64

# --- the planner: the slowest straggler sets T' ---------------------------------------------


@pytest.fixture(scope="module")
def frontier(slice_profile) -> Frontier:  # type: ignore[no-untyped-def]
    profile: Profile = slice_profile([0, 1], {1410, 1305, 1200, 1095, 1005, 900})
    return solve_frontier(profile, one_f_one_b(2, 4), P_A100)


def test_others_are_slowed_to_the_slowest_stragglers_time(frontier: Frontier) -> None:
    t0 = float(frontier.times[0])
    # three straggler times, each of which gives the others a different plan
    times = [t0 * f for f in (1.04, 1.12, 1.25)]
    plans = [frontier.index_for_deadline(t, wait=True) for t in times]
    assert len(set(plans)) == 3, plans
    want = plans[-1]
    pipelines = 6
    slow = (1, 3, 4)
    for order in permutations(range(3)):  # every straggler may be the slowest, in any order
        stragglers = {
            p: Straggler(p, times[k], StragglerSource.DETECTED) for p, k in zip(slow, order, strict=True)
        }  # fmt: skip
        slowest = next(p for p, s in stragglers.items() if s.time == times[-1])
        d = decide(frontier, PlanPolicy(), pipelines, stragglers)
        for p in range(pipelines):
            plan = d.plans[p]
            if p in slow:
                assert plan.index == 0, (order, p)  # stragglers keep the policy's plan
            else:
                assert plan.index == want, (order, p, plan)
                assert f"straggler pipeline {slowest} " in plan.reason, plan.reason
                assert frontier.times[plan.index] <= times[-1]
        assert f"T'={times[-1]:.4g} s" in d.reason, d.reason
    # a reported straggler slower than the detected ones counts the same
    mixed = {
        1: Straggler(1, times[0], StragglerSource.DETECTED),
        2: Straggler(2, times[2], StragglerSource.REPORTED),
        5: Straggler(5, times[1], StragglerSource.DETECTED),
    }
    d = decide(frontier, PlanPolicy(), pipelines, mixed)
    assert [d.plans[p].index for p in (0, 3, 4)] == [want] * 3


# --- duplicates within one stream -----------------------------------------------------------


def _stored(db: Path, rank: str) -> list[int]:
    with connect(db) as c:
        rows = c.execute("SELECT iteration FROM iterations WHERE rank_id = ? ORDER BY rowid", (rank,))  # fmt: skip
        return [int(r[0]) for r in rows]


def _counter(http: httpx.Client, name: str) -> float:
    m = re.search(rf"^{name}(?:\{{\}})? (\S+)$", http.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_repeated_or_lower_sequence_within_one_stream_is_one_duplicate(
    server: ServerProcess, http: httpx.Client, stub: pb_grpc.PlanServiceStub, small_csv: str
) -> None:
    job = solved_job(http, small_csv, data_parallel=2)
    a = register(stub, job, 0, 0, 0).rank_id
    b = register(stub, job, 2, 0, 1).rank_id

    def rep(rank: str, it: int, seq: int) -> pb.IterationReport:
        return pb.IterationReport(
            job_id=job, rank_id=rank, iteration=it, iteration_time=1.0, plan_version=1, sequence=seq
        )  # fmt: skip

    stored = _counter(http, "perseus_iteration_reports_total")
    dups = _counter(http, "perseus_duplicate_reports_total")
    stream = [
        rep(a, 1, 10),
        rep(a, 2, 10),  # the same sequence again: a duplicate
        rep(a, 3, 11),
        rep(a, 4, 7),  # lower than one already sent: a duplicate
        rep(b, 1, 10),  # another rank's sequences are its own
        rep(a, 5, 11),  # equal to the highest: a duplicate
        rep(a, 6, 12),
    ]
    ack = stub.ReportIterations(iter(stream), timeout=10)
    assert (ack.accepted, ack.duplicates) == (7, 3)
    assert _stored(server.db_path, a) == [1, 3, 6]
    assert _stored(server.db_path, b) == [1]
    assert _counter(http, "perseus_iteration_reports_total") == stored + 4
    assert _counter(http, "perseus_duplicate_reports_total") == dups + 3
    st = http.get(f"/jobs/{job}/status").json()
    assert {r["rank_id"]: r["last_iteration"] for r in st["ranks"]} == {a: 6, b: 1}


# --- a first-release database is not partial after migration ---------------------------------


def test_a_migrated_first_release_frontier_is_not_partial(tmp_path: Path, small_csv: str) -> None:
    path = tmp_path / "perseus.db"
    found = first_release_database(path, small_csv)
    with (
        ServerProcess(path) as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        assert http.get(f"/jobs/{JOB}").json()["frontier_status"] == "done"
        front = http.get(f"/jobs/{JOB}/frontier").json()
        assert front["status"] == "done" and "partial" not in front
        assert front["num_points"] == len(found["frontier"])
        plan = http.get(f"/jobs/{JOB}/plan", params={"index": 1}).json()
        assert "partial" not in plan, plan
        st = http.get(f"/jobs/{JOB}/status").json()
        assert st["frontier"]["status"] == "done" and not st["frontier"].get("partial")
        assert "partial" not in st["plan"], st["plan"]
    store = SqliteStore.open(path)
    try:
        assert store.frontier(JOB).partial is False
    finally:
        store.close()
    with connect(path) as db:
        assert db.execute("SELECT partial FROM frontiers WHERE job_id = ?", (JOB,)).fetchone() == (0,)  # fmt: skip


# --- paging ends without a cursor -----------------------------------------------------------


def test_a_page_that_ends_at_the_last_job_has_no_next(tmp_path: Path) -> None:
    n = 6
    with (
        ServerProcess(tmp_path / "perseus.db") as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        ids = [make_job(http, name=f"job {i}") for i in range(n)]
        for limit in range(1, n + 2):
            seen: list[str] = []
            pages = 0
            params: dict[str, str | int] = {"limit": limit}
            while True:
                page = http.get("/jobs", params=params).json()
                pages += 1
                assert page["jobs"], f"limit {limit}: an empty page {pages}"
                seen += [j["id"] for j in page["jobs"]]
                if "next" not in page:
                    break
                assert pages < n + 1, f"limit {limit}: the listing does not end"
                params = {"limit": limit, "after": page["next"]}
            assert seen == ids, limit
            assert pages == math.ceil(n / limit), (limit, pages)
        # the exact fit in one page, and the last page of an exact division
        assert "next" not in http.get("/jobs", params={"limit": n}).json()
        first = http.get("/jobs", params={"limit": n // 2}).json()
        assert "next" in first
        last = http.get("/jobs", params={"limit": n // 2, "after": first["next"]}).json()
        assert [j["id"] for j in last["jobs"]] == ids[n // 2 :] and "next" not in last
