"""``perseus db migrate SRC DST``: the copy of a whole store (``runtime/db_copy.py``).

A populated SQLite store copied into PostgreSQL and back reads the same through every read method of
the store contract; a destination that holds data, and a source with tables this server does not
know, are refused with nothing written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perseus.cli import main as perseus_main
from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import CredentialRow, FrontierRow, TenantRow
from perseus_server.domain.states import SolveStatus
from perseus_server.domain.store import Store, StoreError
from perseus_server.runtime.db_copy import copy_database
from perseus_server.runtime.stores import open_store
from perseus_server.testing.postgres import PostgresServer

from ..postgres_backend import database_for, postgres
from ..sqlite_backend import connect

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)

JOBS = ("b-job", "a-job", "c-job")


def _rank(job_id: str, g: int) -> RankInfo:
    return RankInfo(
        job_id=job_id,
        rank_id=f"{job_id}-{g}",
        global_rank=g,
        pipeline_rank=g % 2,
        data_rank=g // 2,
        tensor_rank=0,
        gpu_name="NVIDIA A40",
        supported_clocks=(1740, 1410, 210),
        hostname=f"node-{g}",
        max_power_limit_w=300.0,
    )


def populate(store: Store) -> None:
    """Something of every kind the store keeps, with revisions, rotations and trimmed history."""
    store.put_tenant(TenantRow("team-a", 100.0, 10, 64, 2.0, 500.0))
    store.put_tenant(TenantRow("team-b", 50.0))
    for i, job_id in enumerate(JOBS):
        spec = JobSpec(stages=2, microbatches=4, data_parallel=2, name=f"j{i}")
        store.add_job(job_id, spec, *(("team-a",) if i == 1 else ()))
        for g in range(4):
            store.put_rank(_rank(job_id, g))
            rows = [(f"{job_id}-{g}", it, 1.0 + it / 7, 3.0 * it, 1 + it // 5) for it in range(12)]
            store.add_iterations(
                job_id, rows, keep=9, sequences={(f"{job_id}-{g}", inc): 5 + inc for inc in (3, 1)}
            )
        store.put_job_lifecycle(job_id, ("active", "idle", "finished")[i], 10.0 + i, f"why {i}")
    store.put_profile("a-job", "csv one", "upload")
    store.put_profile("a-job", "csv two", "online profiling")
    store.put_frontier(
        "a-job",
        FrontierRow(SolveStatus.PARTIAL, 0.25, None, '{"p": [1.5]}', 2, 1.0, None, 0.5, True),
    )
    store.put_frontier("b-job", FrontierRow(SolveStatus.DONE, 1.0, "old error", None, 1, 2.0, 3.0))
    store.put_deployment("a-job", 7, {"deployment": {"indices": [1, 0]}, "x": 0.1})
    store.put_profiling("b-job", {"status": "running", "steps": [1410, 1395]})
    store.add_credential("c-read", "read", None, "h-read")
    store.add_credential("c-rank", "rank", "a-job", "h-rank")
    store.add_credential("c-gone", "rank", "b-job", "h-gone")
    store.add_credential("c-team", "tenant", None, "h-team", "team-b")
    store.rotate_credential("c-rank", "h-rank-2")
    store.revoke_credential("c-gone")
    store.bind_rank("a-job-0", "a-job", 0, "c-rank")
    store.bind_rank("a-job-1", "a-job", 1, "c-rank")
    store.put_power_budget({"watts": 900.0, "policy": "min_energy", "jobs": ["a-job"]})


def _credential(row: CredentialRow | None) -> Any:
    return None if row is None else tuple(getattr(row, k) for k in CredentialRow.__slots__)


def snapshot(store: Store) -> dict[str, Any]:
    """Everything the store's read methods return."""
    out: dict[str, Any] = {
        "jobs": [(j.id, j.created, j.spec.to_json(), j.tenant) for j in store.jobs()],
        "tenants": [tuple(getattr(t, k) for k in TenantRow.__slots__) for t in store.tenants()],
        "count": len(store.jobs()),
        "interrupted": sorted(store.interrupted_solves()),
        "credentials": [_credential(c) for c in store.credentials()],
        "power_budget": store.power_budget(),
        "lifecycles": store.job_lifecycles(),
    }
    for job_id in JOBS:
        f = store.frontier(job_id)
        out[job_id] = {
            "profile": store.profile(job_id),
            "frontier": tuple(getattr(f, k) for k in FrontierRow.__slots__),
            "deployment": store.deployment(job_id),
            "profiling": store.profiling(job_id),
            "ranks": store.ranks(job_id),
            "iterations": [store.iterations(f"{job_id}-{g}", 100) for g in range(4)],
            "sequences": {r: list(v.items()) for r, v in store.report_sequences(job_id).items()},
            "credentials": [_credential(c) for c in store.credentials(job_id)],
            "slots": [store.slot_binding(job_id, g) for g in range(4)],
            "bindings": [store.rank_binding(f"{job_id}-{g}") for g in range(4)],
        }
    for digest in ("h-read", "h-rank", "h-rank-2", "h-gone", "h-team"):
        out[digest] = _credential(store.credential_by_hash(digest))
    return out


def _snapshot_of(target: str) -> dict[str, Any]:
    store = open_store(target)
    try:
        return snapshot(store)
    finally:
        store.close()


def test_sqlite_to_postgres_and_back_reads_the_same(
    postgres: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(tmp_path / "src.db")
    store = open_store(src)
    populate(store)
    store.close()
    before = _snapshot_of(src)
    assert before["a-job"]["profile"] == ("csv two", 2, "online profiling")
    assert len(before["a-job"]["iterations"][0]) == 9  # the history as trimmed
    assert [t[0] for t in before["tenants"]] == ["team-b", "team-a", "default"]
    assert [j[3] for j in before["jobs"]] == ["default", "team-a", "default"]

    pg = database_for(postgres, tmp_path)
    assert perseus_main(["db", "migrate", src, pg]) == 0
    assert "copied" in capsys.readouterr().out
    assert _snapshot_of(pg) == before

    back = f"sqlite:///{tmp_path / 'back.db'}"
    assert perseus_main(["db", "migrate", pg, back]) == 0
    assert _snapshot_of(back) == before
    # The copies go on as stores: the next profile revision follows the copied one, and a
    # rank's history is trimmed from its copied oldest.
    again = open_store(pg)
    try:
        assert again.put_profile("a-job", "csv three", "upload") == 3
        again.add_iterations("a-job", [("a-job-0", 99, 1.0, 1.0, 9)], keep=9)
        assert [it[0] for it in again.iterations("a-job-0", 100)] == [*range(4, 12), 99]
    finally:
        again.close()


def test_a_destination_with_data_is_refused_and_left_alone(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    src = str(tmp_path / "src.db")
    store = open_store(src)
    populate(store)
    store.close()
    pg = database_for(postgres, tmp_path)
    dst = open_store(pg)
    dst.add_job("mine", JobSpec(stages=2, microbatches=4))
    dst.close()
    with pytest.raises(StoreError, match="not empty .*jobs"):
        copy_database(src, pg)
    assert [j[0] for j in _snapshot_of(pg)["jobs"]] == ["mine"]
    with pytest.raises(StoreError, match="same database"):
        copy_database(src, src)


def test_a_source_with_an_unknown_table_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    open_store(str(src)).close()
    with connect(src) as db:
        db.execute("CREATE TABLE tenants_of_the_future (id TEXT)")
    assert perseus_main(["db", "migrate", str(src), str(dst)]) == 1
    err = capsys.readouterr().err
    assert "tenants_of_the_future" in err and "does not know" in err
    assert _snapshot_of(str(dst))["jobs"] == []


def test_sqlite_urls_name_files(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    store.add_job("x", JobSpec(stages=2, microbatches=4))
    store.close()
    assert (tmp_path / "a.db").is_file()
    assert [j[0] for j in _snapshot_of(str(tmp_path / "a.db"))["jobs"]] == ["x"]
