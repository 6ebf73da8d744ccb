"""A full disk is a clear, retryable error.

Issue #32 item 5: it was a 500 "Internal server error" over REST and ``UNKNOWN`` over gRPC. Now REST
answers 503 with ``Retry-After`` and a problem body (``kind: disk_full``), gRPC ``UNAVAILABLE``,
with a log line and ``perseus_store_errors_total{kind="disk_full"}``; nothing acknowledged is lost,
and writes succeed again once space returns, without a restart.

For real on a 3 MiB tmpfs when running as root (``mount`` needs it); in process, with the
store's connection made to fail as SQLite does on a full disk, everywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi.testclient import TestClient

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.config import Limits
from perseus_server.rest import create_app
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService

from ..conftest import register

JOB = {"stages": 2, "microbatches": 4, "blocking_power": 70.0}


def _store_errors(metrics: str) -> float:
    m = re.search(r'^perseus_store_errors_total\{kind="disk_full"\} (\S+)$', metrics, re.M)
    return float(m.group(1)) if m else 0.0


def _assert_retryable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"].isdigit()
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["kind"] == "disk_full" and "disk is full" in body["detail"]


class _FullDisk:
    """A connection that fails every write as SQLite does when its disk is full."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.full = True

    def execute(self, sql: str, *args: Any) -> Any:
        self._check(sql)
        return self._conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        self._check(sql)
        return self._conn.executemany(sql, *args)

    def _check(self, sql: str) -> None:
        if self.full and sql.split()[0].upper() in ("INSERT", "UPDATE", "DELETE", "COMMIT"):
            err = sqlite3.OperationalError("database or disk is full")
            err.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
            raise err

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_a_full_disk_is_a_retryable_503_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqlStore.open(tmp_path / "full.db")
    try:
        service = PerseusService(store, Limits())
        with TestClient(create_app(service), base_url="http://localhost") as http:
            first = http.post("/jobs", json=JOB)
            assert first.status_code == 201
            disk = _FullDisk(store._single)  # type: ignore[arg-type]
            store._single = disk  # type: ignore[assignment]
            _assert_retryable(http.post("/jobs", json=JOB))
            assert "the disk is full" in caplog.text
            assert _store_errors(http.get("/metrics").text) == 1
            ids = [j["id"] for j in http.get("/jobs").json()["jobs"]]
            assert ids == [first.json()["id"]]  # nothing half-made, nothing lost
            disk.full = False  # space returns
            assert http.post("/jobs", json=JOB).status_code == 201
            assert len(http.get("/jobs").json()["jobs"]) == 2
    finally:
        store.close()


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(fs: Path) -> Path:
    """Fill ``fs`` to its last byte with one file."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        for block in (65536, 512):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * block)
    return filler


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None,
    reason="mounting a size-limited tmpfs needs root (the in-process test covers the rest)",
)
def test_a_real_full_disk_over_rest_and_grpc(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "fs", "3m") as fs, ServerProcess(fs / "perseus.db") as srv:
        http = httpx.Client(base_url=srv.http_url, timeout=30)
        job = http.post("/jobs", json=JOB).json()["id"]
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = pb_grpc.PlanServiceStub(ch)
            rank = register(stub, job, 0, 0).rank_id
            filler = _fill(fs)
            acknowledged, answer = [job], None
            for _ in range(2000):  # until the database's free pages are used up too
                answer = http.post("/jobs", json=JOB)
                if answer.status_code != 201:
                    break
                acknowledged.append(answer.json()["id"])
            assert answer is not None
            _assert_retryable(answer)
            report = pb.IterationReport(
                job_id=job, rank_id=rank, iteration=1, iteration_time=1.0, sequence=1
            )
            with pytest.raises(grpc.RpcError) as e:
                stub.ReportIterations(iter([report]), timeout=30)
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE, e.value.details()
            assert "disk is full" in (e.value.details() or "")
            assert _store_errors(http.get("/metrics").text) >= 2
            filler.unlink()  # space returns: the same requests succeed, no restart
            assert http.post("/jobs", json=JOB).status_code == 201
            assert stub.ReportIterations(iter([report]), timeout=30).accepted == 1
        ids = {j["id"] for j in http.get("/jobs", params={"limit": 1000}).json()["jobs"]}
        assert set(acknowledged) <= ids
