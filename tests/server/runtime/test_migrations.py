"""The store's schema version.

Ordered migrations applied on start, and a database written by the first release (schema version 1,
without ``user_version``) served by this server, its finished frontier still finished (not partial)
after migration.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime.sqlite_store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    SqliteStore,
    StoreError,
    migrate,
)

from ..conftest import register
from ..sqlite_backend import (
    JOB,
    RANK,
    VERSION,
    connect,
    first_release_database,
    set_user_version,
    user_version,
)


def test_new_database_gets_the_current_version(tmp_path: Path) -> None:
    SqliteStore.open(tmp_path / "new.db").close()
    assert user_version(tmp_path / "new.db") == SCHEMA_VERSION == len(MIGRATIONS)


def test_first_release_database_is_version_1_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    first_release_database(path)
    assert user_version(path) == 0
    store = SqliteStore.open(path)
    assert [j.id for j in store.jobs()] == [JOB]
    assert [r.rank_id for r in store.ranks(JOB)] == [RANK]
    assert [it[0] for it in store.iterations(RANK, 10)] == [7, 8]
    assert store.report_sequences(JOB) == {}  # version 2: no sequence seen yet
    store.close()
    # Recognised as version 1 (its data kept), then migrated to the current version.
    assert user_version(path) == SCHEMA_VERSION >= 2


def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SqliteStore.open(path).close()
    set_user_version(path, SCHEMA_VERSION + 1)
    with pytest.raises(StoreError, match="newer"):
        SqliteStore.open(path)


def test_an_appended_migration_runs_once_in_order(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    first_release_database(path)
    runs: list[int] = []

    def v2_add_note(db: sqlite3.Connection) -> None:
        runs.append(2)
        db.execute("ALTER TABLE jobs ADD COLUMN note TEXT NOT NULL DEFAULT ''")

    migrations = (*MIGRATIONS, v2_add_note)
    with connect(path) as conn:
        assert migrate(conn, migrations) == 1
        assert migrate(conn, migrations) == len(migrations)  # already there: nothing runs again
        assert runs == [2]
        assert int(conn.execute("PRAGMA user_version").fetchone()[0]) == len(migrations)
        assert conn.execute("SELECT id, note FROM jobs").fetchall() == [(JOB, "")]


def test_a_failing_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    first_release_database(path)

    def v2_broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (a INTEGER)")
        raise RuntimeError("boom")

    with connect(path) as conn:
        with pytest.raises(RuntimeError, match="boom"):
            migrate(conn, (*MIGRATIONS, v2_broken))
        # The steps before it are committed, the failing one changed nothing.
        assert int(conn.execute("PRAGMA user_version").fetchone()[0]) == len(MIGRATIONS)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "half_done" not in tables and "jobs" in tables


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
    assert user_version(path) == SCHEMA_VERSION  # migrated, and served


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
