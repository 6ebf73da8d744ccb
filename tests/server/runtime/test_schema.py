"""The store's schema: one Alembic history for SQLite and PostgreSQL.

A new database gets the newest revision; a database stamped by the stores' earlier version tables
(SQLite's ``user_version``, PostgreSQL's ``perseus_schema``) is upgraded in place keeping every
row: the first release's SQLite file, and a SQLite file and a PostgreSQL database written by
the two stores of before (``e4f82c6``, fixtures). A revision appended to the history runs once;
a failing one changes nothing; a database of a newer server is refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.domain.store import StoreError
from perseus_server.runtime import schema
from perseus_server.runtime.schema import legacy_sqlite
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.runtime.stores import engine_for
from perseus_server.testing.postgres import PostgresServer

from ..conftest import register
from ..postgres_backend import database_for, postgres
from ..sqlite_backend import (
    JOB,
    RANK,
    VERSION,
    connect,
    first_release_database,
    set_user_version,
    user_version,
)
from ..store_fixture import COUNTS, assert_holds, load_postgres, sqlite_copy

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)

_SCRATCH = """\"""A scratch revision.\"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    {body}
"""


def revision_of(target: str | Path) -> str | None:
    """The Alembic revision the database has reached."""
    engine = engine_for(target, pool_size=1)
    try:
        with engine.connect() as conn:
            return schema.revision(conn)
    finally:
        engine.dispose()


def counts(target: str | Path) -> dict[str, int]:
    """Rows per table of :data:`COUNTS`."""
    engine = engine_for(target, pool_size=1)
    try:
        with engine.connect() as conn:
            return {
                t: int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {t}").scalar_one())
                for t in COUNTS
            }
    finally:
        engine.dispose()


def history_with(tmp_path: Path, body: str) -> Path:
    """A copy of the store's history with a scratch revision ``0002`` doing ``body``."""
    location = tmp_path / "history"
    shutil.copytree(Path(schema.__file__).parent, location)
    (location / "versions" / "r0002_scratch.py").write_text(_SCRATCH.format(body=body))
    return location


def migrate_fails(path: Path, location: Path) -> None:
    """Migrating the database at ``path`` with the history at ``location`` raises ``boom``."""
    engine = engine_for(path)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            schema.migrate(engine, location)
    finally:
        engine.dispose()


def test_new_database_gets_the_newest_revision(tmp_path: Path) -> None:
    SqlStore.open(tmp_path / "new.db").close()
    assert revision_of(tmp_path / "new.db") == schema.head() == "0001"
    # A server of before reads a version newer than its own, and refuses the file.
    assert user_version(tmp_path / "new.db") == legacy_sqlite.MOVED


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


def test_a_postgres_database_of_the_stores_of_before_upgrades_keeping_every_row(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = database_for(postgres, tmp_path)
    load_postgres(url)
    assert revision_of(url) is None and counts(url) == COUNTS
    store = SqlStore.open(url)
    try:
        assert revision_of(url) == schema.head() and counts(url) == COUNTS
        assert_holds(store)
    finally:
        store.close()
    import psycopg

    with psycopg.connect(url) as conn:  # a server of before refuses it as newer than itself
        assert conn.execute("SELECT version FROM perseus_schema").fetchone() == (1000,)


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


def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    set_user_version(path, 9)  # stamped by a server of before, newer than any of them
    with connect(path) as db:
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY)")
    with pytest.raises(StoreError, match="newer"):
        SqlStore.open(path)


def test_an_appended_revision_runs_once(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    first_release_database(path)
    location = history_with(
        tmp_path,
        "op.add_column('jobs', sa.Column('note', sa.Text, nullable=False, server_default=''))",
    )
    engine = engine_for(path)
    try:
        assert schema.migrate(engine, location) is None
        assert schema.migrate(engine, location) == "0002"  # already there: nothing runs again
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT id, note FROM jobs").all() == [(JOB, "")]
    finally:
        engine.dispose()
    assert revision_of(path) == "0002"


def test_a_failing_revision_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    SqlStore.open(path).close()
    location = history_with(
        tmp_path,
        "op.create_table('half_done', sa.Column('a', sa.Integer))\n    raise RuntimeError('boom')",
    )
    migrate_fails(path, location)
    assert revision_of(path) == "0001"
    with connect(path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "half_done" not in tables and "jobs" in tables


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


def test_operators_upgrade_with_alembic_itself(tmp_path: Path) -> None:
    """``alembic -x db=PATH upgrade head`` with the repository's ``alembic.ini``."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    path = sqlite_copy(tmp_path / "old.db")
    alembic = [sys.executable, "-m", "alembic", "-c", str(root / "alembic.ini"), "-x", f"db={path}"]
    subprocess.run([*alembic, "upgrade", "head"], check=True, capture_output=True, cwd=tmp_path)
    assert revision_of(path) == schema.head() and counts(path) == COUNTS
    current = subprocess.run([*alembic, "current"], check=True, capture_output=True, text=True)
    assert f"{schema.head()} (head)" in current.stdout
    store = SqlStore.open(path)  # and the server takes it as it is
    try:
        assert_holds(store)
    finally:
        store.close()
