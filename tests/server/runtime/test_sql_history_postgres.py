"""The report history on PostgreSQL (``runtime/sql_history.py``).

A real ``perseus serve --db postgresql://...`` keeping what it acknowledged across a restart:
the iterations and the report sequences. The group commit that writes them is
``tests/server/service/test_ingest.py``.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest

from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.testing.postgres import PostgresServer

from ..conftest import register, solved_job
from ..postgres_backend import database_for, postgres
from ..service.test_reports_idempotent import _report

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


@pytest.mark.slow
def test_perseus_serve_on_postgres_keeps_what_it_acknowledged(
    postgres: PostgresServer, tmp_path: Path, small_csv: str
) -> None:
    url = database_for(postgres, tmp_path)
    srv = ServerProcess(url)
    srv.start()
    try:
        assert "db postgresql://perseus@/" in srv.output()
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            job_id = solved_job(http, small_csv)
            version = http.get(f"/jobs/{job_id}").json()["plan_version"]
            assert version >= 1
            with grpc.insecure_channel(srv.grpc_target) as ch:
                stub = pb_grpc.PlanServiceStub(ch)
                rank = register(stub, job_id, 0, 0).rank_id
                batch = [_report(job_id, rank, it, 100 + it) for it in range(3)]
                ack = stub.ReportIterations(iter(batch), timeout=10)
                assert (ack.accepted, ack.duplicates) == (3, 0)
        srv.stop()
        srv.start()
        with httpx.Client(base_url=srv.http_url, timeout=30.0) as http:
            assert http.get(f"/jobs/{job_id}").json()["plan_version"] == version
        with grpc.insecure_channel(srv.grpc_target) as ch:
            ack = pb_grpc.PlanServiceStub(ch).ReportIterations(iter(batch), timeout=10)
            assert (ack.accepted, ack.duplicates) == (3, 3)  # the sequences survived
    finally:
        srv.stop()
    store = SqlStore.open(url)
    try:
        assert [it[0] for it in store.iterations(rank, 10)] == [0, 1, 2]
    finally:
        store.close()
