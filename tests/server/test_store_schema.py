"""The store's schema version: ordered migrations applied on start, and a database written by
the first release (schema version 1, without ``user_version``) served by this server."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from perseus.profiles import parse_profile_csv
from perseus.schedules import make_schedule
from perseus.solver import solve_frontier
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError, migrate

from .conftest import BLOCKING_A40, register

#: The first release's DDL, verbatim (``server/perseus_server/runtime/store.py`` at commit 41619ed).
SCHEMA_41619ED = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, created REAL NOT NULL, spec TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS profiles (
    job_id TEXT PRIMARY KEY, csv TEXT NOT NULL, revision INTEGER NOT NULL, updated REAL NOT NULL,
    source TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS frontiers (
    job_id TEXT PRIMARY KEY, status TEXT NOT NULL, progress REAL NOT NULL, error TEXT,
    doc TEXT, profile_revision INTEGER, started REAL, finished REAL, solve_seconds REAL,
    ready_doc TEXT
);
CREATE TABLE IF NOT EXISTS deployments (
    job_id TEXT PRIMARY KEY, version INTEGER NOT NULL, doc TEXT NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ranks (
    job_id TEXT NOT NULL, global_rank INTEGER NOT NULL, rank_id TEXT NOT NULL UNIQUE,
    info TEXT NOT NULL, registered REAL NOT NULL, PRIMARY KEY (job_id, global_rank)
);
CREATE TABLE IF NOT EXISTS iterations (
    rank_id TEXT NOT NULL, job_id TEXT NOT NULL, iteration INTEGER NOT NULL, time REAL NOT NULL,
    energy REAL NOT NULL, plan_version INTEGER NOT NULL, received REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS iterations_rank ON iterations (rank_id, received);
CREATE TABLE IF NOT EXISTS profiling (
    job_id TEXT PRIMARY KEY, doc TEXT NOT NULL
);
"""

JOB, RANK = "0123456789abcdef", "0123456789abcdef-0-cafe"
VERSION = 5


def _user_version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def _v1_database(path: Path, small_csv: str | None = None) -> dict[str, Any]:
    """A database as the first release wrote it: one job (2 stages x 4 microbatches, 2
    pipelines) with a profile, its frontier, a deployed plan with a reported straggler, a rank
    and two iterations. Returns what the test should find again."""
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_41619ED)
    now = time.time()
    spec = {
        "name": "from 41619ed",
        "stages": 2,
        "microbatches": 4,
        "schedule": {"name": "1f1b", "virtual_stages": 1},
        "data_parallel": 2,
        "tensor_parallel": 1,
        "gpu_model": "A40",
        "blocking_power": BLOCKING_A40,
    }
    db.execute("INSERT INTO jobs VALUES (?, ?, ?)", (JOB, now, json.dumps(spec)))
    found: dict[str, Any] = {}
    if small_csv is not None:
        db.execute(
            "INSERT INTO profiles VALUES (?, ?, ?, ?, ?)", (JOB, small_csv, 1, now, "upload")
        )
        frontier = solve_frontier(
            parse_profile_csv(small_csv), make_schedule("1f1b", 2, 4), BLOCKING_A40
        )
        db.execute(
            "INSERT INTO frontiers (job_id, status, progress, error, doc, profile_revision, "
            "started, finished, solve_seconds) VALUES (?, 'done', 1.0, NULL, ?, 1, ?, ?, 0.5)",
            (JOB, json.dumps(frontier.to_json(compact=True)), now, now),
        )
        straggler_time = float(frontier.times[0]) * 1.2
        deployment = {
            "deployment": {
                "kind": "plan",
                "reason": "straggler pipeline(s) 1",
                "own": [],
                "indices": [1, 0],
                "reasons": ["slowed to match straggler pipeline 1", "straggler (reported)"],
                "profiling": None,
                "max_clock": 0,
                "deployed_at": now,
            },
            "policy": {"kind": "index", "value": 0.0},
            "overrides": {},
            "stragglers": [{"pipeline": 1, "time": straggler_time, "source": "reported"}],
            "detector": {"threshold": 0.05, "consecutive": 3, "recovery": 0.02},
            "slow_stages": {},
        }
        db.execute(
            "INSERT INTO deployments VALUES (?, ?, ?, ?)",
            (JOB, VERSION, json.dumps(deployment), now),
        )
        found.update(frontier=frontier, straggler_time=straggler_time)
    info = {
        "rank_id": RANK,
        "global_rank": 0,
        "pipeline_rank": 0,
        "data_rank": 0,
        "tensor_rank": 0,
        "gpu_name": "NVIDIA A40",
        "supported_clocks_mhz": [],
        "hostname": "test",
    }
    db.execute("INSERT INTO ranks VALUES (?, 0, ?, ?, ?)", (JOB, RANK, json.dumps(info), now))
    db.executemany(
        "INSERT INTO iterations VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(RANK, JOB, i, 1.5, 10.0, VERSION, now) for i in (7, 8)],
    )
    db.commit()
    db.close()
    return found


def test_new_database_gets_the_current_version(tmp_path: Path) -> None:
    Store.open(tmp_path / "new.db").close()
    assert _user_version(tmp_path / "new.db") == SCHEMA_VERSION == len(MIGRATIONS)


def test_first_release_database_is_version_1_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _v1_database(path)
    assert _user_version(path) == 0
    store = Store.open(path)
    assert [j.id for j in store.jobs()] == [JOB]
    assert [r.rank_id for r in store.ranks(JOB)] == [RANK]
    assert [it[0] for it in store.iterations(RANK, 10)] == [7, 8]
    assert store.report_sequences(JOB) == {}  # version 2: no sequence seen yet
    store.close()
    # Recognised as version 1 (its data kept), then migrated to the current version.
    assert _user_version(path) == SCHEMA_VERSION >= 2


def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    Store.open(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        Store.open(path)


def test_an_appended_migration_runs_once_in_order(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _v1_database(path)
    runs: list[int] = []

    def v2_add_note(db: sqlite3.Connection) -> None:
        runs.append(2)
        db.execute("ALTER TABLE jobs ADD COLUMN note TEXT NOT NULL DEFAULT ''")

    migrations = (*MIGRATIONS, v2_add_note)
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, migrations) == 1
    assert migrate(conn, migrations) == len(migrations)  # already there: nothing runs again
    assert runs == [2]
    assert int(conn.execute("PRAGMA user_version").fetchone()[0]) == len(migrations)
    assert conn.execute("SELECT id, note FROM jobs").fetchall() == [(JOB, "")]
    conn.close()


def test_a_failing_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _v1_database(path)

    def v2_broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (a INTEGER)")
        raise RuntimeError("boom")

    conn = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(RuntimeError, match="boom"):
        migrate(conn, (*MIGRATIONS, v2_broken))
    # The steps before it are committed, the failing one changed nothing.
    assert int(conn.execute("PRAGMA user_version").fetchone()[0]) == len(MIGRATIONS)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "half_done" not in tables and "jobs" in tables
    conn.close()


def test_server_serves_a_job_written_by_the_first_release(tmp_path: Path, small_csv: str) -> None:
    path = tmp_path / "perseus.db"
    found = _v1_database(path, small_csv)
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
    assert _user_version(path) == SCHEMA_VERSION  # migrated, and served
