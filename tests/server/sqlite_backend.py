"""Test-only access to the SQLite backend below the store protocol.

The protocol is :class:`~perseus_server.domain.store.Store`; this is the only place the tests open a
database file with :mod:`sqlite3` themselves.

What only this backend has (its schema version, a database as the first release wrote it, a
row corrupted on disk, what the file holds) is read and written here; everything else goes
through the store.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from perseus.profiles import parse_profile_csv
from perseus.schedules import make_schedule
from perseus.solver import solve_frontier

from .conftest import BLOCKING_A40

__all__ = [
    "JOB",
    "RANK",
    "VERSION",
    "column_values",
    "connect",
    "corrupt_column",
    "first_release_database",
    "set_user_version",
    "user_version",
]


@contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A raw autocommit connection to the database file (closed on exit)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        yield db


def user_version(path: Path) -> int:
    """The file's schema version (``PRAGMA user_version``)."""
    with connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def set_user_version(path: Path, version: int) -> None:
    with connect(path) as db:
        db.execute(f"PRAGMA user_version = {int(version)}")


def corrupt_column(path: Path, table: str, column: str, key: str) -> None:
    """Overwrite one row's ``column`` with unreadable JSON (the row of job ``key``)."""
    key_column = "id" if table == "jobs" else "job_id"
    with connect(path) as db:
        db.execute(f"UPDATE {table} SET {column} = '{{garbage' WHERE {key_column} = ?", (key,))


def column_values(path: Path, table: str, column: str) -> set[Any]:
    """Every value of ``column`` in ``table``, as stored on disk."""
    with connect(path) as db:
        return {r[0] for r in db.execute(f"SELECT {column} FROM {table}")}


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


def first_release_database(path: Path, small_csv: str | None = None) -> dict[str, Any]:
    """A database as the first release wrote it.

    One job (2 stages x 4 microbatches, 2 pipelines) with a profile, its frontier, a deployed
    plan with a reported straggler, a rank and two iterations. Returns what the test should find
    again.
    """
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
