"""``runtime/schema/legacy_sqlite.py``: SQLite files of before Alembic, upgraded keeping every row.

A file stamped by the SQLite store's own version table (``user_version``; the first release set
none) is brought through the missing steps and onto the baseline: the file of the stores of
``e4f82c6`` (a fixture), and the first release's, served by a real server afterwards.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime import schema
from perseus_server.runtime.sql_store import SqlStore

from ...conftest import register
from ...sqlite_backend import JOB, RANK, VERSION, connect, first_release_database, user_version
from ...store_fixture import COUNTS, assert_holds, sqlite_copy
from .databases import counts, history_with, migrate_fails, revision_of


def test_a_sqlite_file_of_the_stores_of_before_upgrades_keeping_every_row(tmp_path: Path) -> None:
    path = sqlite_copy(tmp_path / "old.db")
    assert user_version(path) == 8 and revision_of(path) is None
    assert counts(path) == COUNTS
    store = SqlStore.open(path)
    try:
        assert revision_of(path) == schema.head()
        assert counts(path) == COUNTS
        assert_holds(store)
    finally:
        store.close()


def test_first_release_database_is_version_1_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    first_release_database(path)
    assert user_version(path) == 0
    store = SqlStore.open(path)
    assert [j.id for j in store.jobs()] == [JOB]
    assert [r.rank_id for r in store.ranks(JOB)] == [RANK]
    assert [it[0] for it in store.iterations(RANK, 10)] == [7, 8]
    assert store.report_sequences(JOB) == {}  # version 2: no sequence seen yet
    store.close()
    assert revision_of(path) == schema.head()


def test_a_failing_first_upgrade_leaves_a_file_of_before_as_it_was(tmp_path: Path) -> None:
    path = sqlite_copy(tmp_path / "old.db")
    location = history_with(tmp_path, "raise RuntimeError('boom')")
    migrate_fails(path, location)
    assert user_version(path) == 8 and revision_of(path) is None and counts(path) == COUNTS


def test_server_serves_a_job_written_by_the_first_release(tmp_path: Path, small_csv: str) -> None:
    path = tmp_path / "perseus.db"
    found = first_release_database(path, small_csv)
    frontier = found["frontier"]
    with (
        ServerProcess(path) as srv,
        httpx.Client(base_url=srv.http_url, timeout=30.0) as http,
    ):
        job = http.get(f"/jobs/{JOB}").json()
        assert job["state"] == "ready" and job["name"] == "from 41619ed"
        assert job["profile"] == {"revision": 1, "source": "upload"}
        assert job["frontier_status"] == "done" and job["plan_version"] == VERSION
        assert [j["id"] for j in http.get("/jobs").json()["jobs"]] == [JOB]

        front = http.get(f"/jobs/{JOB}/frontier").json()
        assert front["num_points"] == len(frontier)
        assert front["points"][0]["time"] == pytest.approx(float(frontier.times[0]))
        plan = http.get(f"/jobs/{JOB}/plan", params={"index": 1}).json()
        assert plan["time"] == pytest.approx(float(frontier.times[1]))

        st = http.get(f"/jobs/{JOB}/status").json()
        assert st["plan"]["version"] == VERSION
        assert [p["index"] for p in st["plan"]["pipelines"]] == [1, 0]
        assert st["pipelines"][1]["straggler"] == {
            "time": pytest.approx(found["straggler_time"]),
            "source": "reported",
        }
        (rank,) = st["ranks"]
        assert rank["rank_id"] == RANK and rank["last_iteration"] == 8

        channel = grpc.insecure_channel(srv.grpc_target)
        stub = pb_grpc.PlanServiceStub(channel)
        resp = register(stub, JOB, 0, 0)
        assert resp.rank_id == RANK and resp.plan_version == VERSION
        stream = stub.WatchPlan(pb.WatchPlanRequest(job_id=JOB, rank_id=RANK), timeout=10)
        msg = next(stream)
        stream.cancel()
        channel.close()
        assert msg.version == VERSION and len(msg.steps) == 2 * 4
        assert msg.expected_iteration_time == pytest.approx(float(frontier.times[1]))
    assert revision_of(path) == schema.head()  # migrated, and served


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
    store = SqlStore.open(path)
    try:
        assert store.frontier(JOB).partial is False
    finally:
        store.close()
    with connect(path) as db:
        assert db.execute("SELECT partial FROM frontiers WHERE job_id = ?", (JOB,)).fetchone() == (0,)  # fmt: skip
