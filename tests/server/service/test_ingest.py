"""Iteration reports committed in groups off the event loop (``service/ingest.py``).

:class:`~perseus_server.service.ingest.ReportWriter` on a real PostgreSQL database (the store
it is given to): nothing acknowledged lost, re-sent reports still dropped, a failed commit failing
its whole group (and nothing of it remembered), a deleted job's waiting reports refused alone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.values import RankRegistration
from perseus_server import Limits
from perseus_server.domain.jobs import JobSpec
from perseus_server.grpc.received import WireReport
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.service import PerseusService
from perseus_server.testing.postgres import PostgresServer

from ..postgres_backend import database_for, postgres

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


def _service(pg: PostgresServer, tmp_path: Path) -> tuple[PerseusService, SqlStore, str]:
    url = database_for(pg, tmp_path)
    store = SqlStore.open(url)
    return PerseusService(store, Limits(), ingest_off_loop=True), store, url


def _setup(service: PerseusService, ranks: int) -> tuple[str, list[str]]:
    job_id = service.create_job(JobSpec(stages=2, microbatches=4, data_parallel=ranks // 2))["id"]
    ids = [
        service.registration.register(RankRegistration(job_id, g, g % 2, g // 2)).rank_id
        for g in range(ranks)
    ]
    return job_id, ids


def _rep(job_id: str, rank_id: str, it: int, seq: int) -> WireReport:
    return WireReport.of(
        pb.IterationReport(
            job_id=job_id,
            rank_id=rank_id,
            iteration=it,
            iteration_time=1.0 + it / 100,
            plan_version=0,
            energy=5.0,
            sequence=seq,
        )  # fmt: skip
    )


async def _ingest(service: PerseusService, reps: list[WireReport]) -> list[Any]:
    return await asyncio.gather(*(service.ingest_report(r) for r in reps), return_exceptions=True)


def test_concurrent_reports_commit_in_groups_and_every_one_is_stored(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    service, store, url = _service(postgres, tmp_path)
    try:
        job_id, ranks = _setup(service, 8)
        reps = [_rep(job_id, r, it, 1 + it) for it in range(5) for r in ranks]
        results = asyncio.run(_ingest(service, reps))
        assert results == [(1, 0)] * len(reps)
        writer = service.report_writer
        assert writer is not None and writer.written == len(reps)
        # Concurrent reports share commits (the first goes alone, the rest wait for it).
        assert writer.groups < len(reps) / 4
        # Re-sent reports are acknowledged as duplicates, also when sent together with new ones.
        again = asyncio.run(_ingest(service, reps[:8] + [_rep(job_id, ranks[0], 9, 10)]))
        assert again == [(0, 1)] * 8 + [(1, 0)]
    finally:
        asyncio.run(service.shutdown())
        store.close()
    # Everything acknowledged is in the database, as another server reads it.
    other = SqlStore.open(url)
    try:
        assert [it[0] for it in other.iterations(ranks[0], 100)] == [0, 1, 2, 3, 4, 9]
        for r in ranks[1:]:
            assert [it[0] for it in other.iterations(r, 100)] == [0, 1, 2, 3, 4]
        assert other.report_sequences(job_id)[ranks[0]] == {0: 10}
    finally:
        other.close()


def test_a_failed_commit_fails_its_group_and_a_resend_is_taken(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, store, url = _service(postgres, tmp_path)
    try:
        job_id, ranks = _setup(service, 4)
        reps = [_rep(job_id, r, 1, 1) for r in ranks]
        real = store.add_iterations

        def broken(*args: Any, **kwargs: Any) -> None:
            real(*args, **kwargs)  # written, then the transaction fails: rolled back
            raise RuntimeError("the database went away")

        monkeypatch.setattr(store, "add_iterations", broken)
        results = asyncio.run(_ingest(service, reps))
        assert all(isinstance(r, RuntimeError) for r in results), results
        assert all(store.iterations(r, 10) == [] for r in ranks)
        assert service.jobs.get(job_id).ranks.last_sequence == {}
        monkeypatch.setattr(store, "add_iterations", real)
        # The ranks send them again: new, stored once.
        assert asyncio.run(_ingest(service, reps)) == [(1, 0)] * 4
        assert all(len(store.iterations(r, 10)) == 1 for r in ranks)
    finally:
        asyncio.run(service.shutdown())
        store.close()


def test_reports_of_a_job_deleted_while_they_wait_are_refused_alone(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    service, store, _ = _service(postgres, tmp_path)
    try:
        gone, gone_ranks = _setup(service, 2)
        kept, kept_ranks = _setup(service, 2)

        async def scenario() -> list[Any]:
            first = asyncio.ensure_future(_ingest(service, [_rep(kept, kept_ranks[0], 1, 1)]))
            await asyncio.sleep(0)  # its commit is in flight; these two wait for the next group
            waiting = asyncio.ensure_future(
                _ingest(service, [_rep(gone, gone_ranks[0], 1, 1), _rep(kept, kept_ranks[1], 1, 1)])
            )
            await asyncio.sleep(0)
            await service.delete_job(gone)
            return [*(await first), *(await waiting)]

        a, b, c = asyncio.run(scenario())
        assert a == (1, 0) and c == (1, 0)
        assert getattr(b, "status", None) == 404, b
        assert store.iterations(gone_ranks[0], 10) == []
        assert len(store.iterations(kept_ranks[1], 10)) == 1
    finally:
        asyncio.run(service.shutdown())
        store.close()


def test_a_writer_needs_a_store_that_two_threads_may_use() -> None:
    with pytest.raises(ValueError, match="two threads"):
        PerseusService(SqlStore.open(":memory:"), Limits(), ingest_off_loop=True)
