"""The store contract, run against every implementation.

The :class:`~perseus_server.domain.store.Store` contract, run against every implementation (as
networkx runs its max-flow tests over every flow function): transactions that nest, rollback,
after-commit callbacks, each row type written and read back, ordering, deletion, and (for the
backends that keep a file) what survives a reopen and a database of the first release.

A new backend adds one :class:`Backend` to :data:`BACKENDS`; every test here then runs on it.
PostgreSQL runs on a real server the session starts (``initdb`` / ``pg_ctl``, one fresh database
per test; skipped, saying so, where PostgreSQL is not installed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import DEFAULT_TENANT, FrontierRow, TenantRow
from perseus_server.domain.states import SolveStatus
from perseus_server.domain.store import Store, StoreError
from perseus_server.runtime.sql_store import SqlStore
from perseus_server.testing.postgres import PostgresServer

from ..postgres_backend import database_for, postgres, set_revision
from ..sqlite_backend import JOB, RANK, first_release_database

__all__ = ["postgres"]  # the session's PostgreSQL server (a fixture)


@dataclass(frozen=True)
class Backend:
    """How the suite opens one implementation.

    ``open(tmp_path)``; ``reopen(tmp_path)`` opens the same database again (None: it does not
    outlive its store); ``old_database(path)`` writes a database of the first release there,
    ``newer_database(path)`` marks a database as written by a newer server (None: the backend
    has none).
    """

    name: str
    open: Callable[[Path], Store]
    reopen: Callable[[Path], Store] | None = None
    old_database: Callable[[Path], Any] | None = None
    newer_database: Callable[[Path], None] | None = None


BACKENDS = [
    Backend(
        "sqlite-file",
        lambda tmp: SqlStore.open(tmp / "store.db"),
        reopen=lambda tmp: SqlStore.open(tmp / "store.db"),
        old_database=lambda tmp: first_release_database(tmp / "store.db"),
        newer_database=lambda tmp: set_revision(tmp / "store.db", "9999-newer"),
    ),
    Backend("sqlite-memory", lambda tmp: SqlStore.open(":memory:")),
]


def postgres_backend(pg: PostgresServer) -> Backend:
    """A real PostgreSQL server (the session's), one database per test."""

    def open_(tmp: Path) -> Store:
        return SqlStore.open(database_for(pg, tmp))

    return Backend(
        "postgresql",
        open_,
        reopen=open_,
        newer_database=lambda tmp: set_revision(database_for(pg, tmp), "9999-newer"),
    )


@pytest.fixture(params=[*BACKENDS, "postgresql"], ids=[*(b.name for b in BACKENDS), "postgresql"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "postgresql":
        return postgres_backend(request.getfixturevalue("postgres"))
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def store(backend: Backend, tmp_path: Path) -> Any:
    s = backend.open(tmp_path)
    yield s
    s.close()


def _spec(**overrides: Any) -> JobSpec:
    return JobSpec(**{"stages": 2, "microbatches": 4, "blocking_power": 70.38, **overrides})


def _rank(job_id: str, g: int, rank_id: str | None = None) -> RankInfo:
    return RankInfo(
        job_id=job_id,
        rank_id=rank_id or f"{job_id}-{g}",
        global_rank=g,
        pipeline_rank=g % 2,
        data_rank=g // 2,
        tensor_rank=0,
        gpu_name="NVIDIA A40",
        supported_clocks=(1740, 1410, 210),
        hostname="node-1",
    )


def _credential(store: Store, credential_id: str) -> Any:
    """The stored credential ``credential_id``, or None (as the service finds it)."""
    return next((c for c in store.credentials() if c.id == credential_id), None)


def _frontier_fields(row: FrontierRow) -> tuple[Any, ...]:
    return tuple(getattr(row, k) for k in FrontierRow.__slots__)


# --- transactions and after-commit -----------------------------------------------------------


def test_writes_in_a_transaction_commit_together_then_callbacks_run(store: Store) -> None:
    seen: list[Any] = []
    with store.transaction():
        store.add_job("a", _spec())
        store.after_commit(lambda: seen.append(("first", store.profile("a"))))
        store.put_profile("a", "csv", "upload")
        store.after_commit(lambda: seen.append("second"))
        assert seen == []  # not before the commit
    # In the order given, and after the commit: the callback sees every write.
    assert seen == [("first", ("csv", 1, "upload")), "second"]


def test_nested_transactions_join_the_outermost(store: Store) -> None:
    seen: list[str] = []
    with store.transaction():
        with store.transaction():
            store.add_job("a", _spec())
            store.after_commit(lambda: seen.append("inner"))
        assert seen == []  # the inner one's end is not a commit
        store.add_job("b", _spec())
        store.after_commit(lambda: seen.append("outer"))
    assert seen == ["inner", "outer"]
    assert {j.id for j in store.jobs()} == {"a", "b"}


def test_an_exception_rolls_back_every_level_and_drops_the_callbacks(store: Store) -> None:
    store.add_job("kept", _spec())
    seen: list[str] = []
    with pytest.raises(RuntimeError, match="boom"), store.transaction():
        store.add_job("outer", _spec())
        store.put_profile("kept", "csv", "upload")
        store.after_commit(lambda: seen.append("outer"))
        with store.transaction():
            store.add_job("inner", _spec())
            store.after_commit(lambda: seen.append("inner"))
            raise RuntimeError("boom")
    assert seen == []
    assert [j.id for j in store.jobs()] == ["kept"]
    assert store.profile("kept") is None
    # The store goes on: a later transaction commits, and runs only its own callbacks.
    with store.transaction():
        store.add_job("later", _spec())
        store.after_commit(lambda: seen.append("later"))
    assert seen == ["later"]
    assert [j.id for j in store.jobs()] == ["kept", "later"]


def test_after_commit_outside_a_transaction_runs_at_once(store: Store) -> None:
    seen: list[str] = []
    store.after_commit(lambda: seen.append("now"))
    assert seen == ["now"]


def test_a_rolled_back_write_is_not_there_after_a_reopen(backend: Backend, tmp_path: Path) -> None:
    if backend.reopen is None:
        pytest.skip(f"{backend.name} does not outlive its store")
    store = backend.open(tmp_path)
    store.add_job("committed", _spec(name="kept"))
    with pytest.raises(RuntimeError), store.transaction():
        store.add_job("rolled-back", _spec())
        raise RuntimeError("boom")
    store.close()
    again = backend.reopen(tmp_path)
    try:
        assert [(j.id, j.spec.name) for j in again.jobs()] == [("committed", "kept")]
    finally:
        again.close()


# --- each row type, written and read back ----------------------------------------------------


def test_jobs_round_trip_oldest_first(store: Store) -> None:
    specs = {k: _spec(name=f"job {k}", data_parallel=1 + i) for i, k in enumerate("cab")}
    rows = [store.add_job(k, s) for k, s in specs.items()]
    assert [r.id for r in rows] == ["c", "a", "b"]
    got = store.jobs()
    assert [(j.created, j.id) for j in got] == sorted((r.created, r.id) for r in rows)
    for j in got:
        assert j.spec == specs[j.id]
        assert j.created == next(r.created for r in rows if r.id == j.id)
    assert len(store.jobs()) == 3


def test_profile_revisions_count_up(store: Store) -> None:
    store.add_job("a", _spec())
    assert store.profile("a") is None
    assert store.put_profile("a", "one", "upload") == 1
    assert store.put_profile("a", "two", "online profiling") == 2
    assert store.profile("a") == ("two", 2, "online profiling")


def test_frontier_rows_round_trip(store: Store) -> None:
    store.add_job("a", _spec())
    assert _frontier_fields(store.frontier("a")) == _frontier_fields(FrontierRow())
    row = FrontierRow(SolveStatus.PARTIAL, 0.5, "err", '{"x": 1}', 3, 10.0, 20.5, 1.25, True)
    store.put_frontier("a", row)
    got = store.frontier("a")
    assert _frontier_fields(got) == _frontier_fields(row)
    assert got.status is SolveStatus.PARTIAL and got.partial is True
    store.add_job("b", _spec())
    store.put_frontier("b", FrontierRow(SolveStatus.DONE, 1.0))
    store.add_job("c", _spec())
    store.put_frontier("c", FrontierRow(SolveStatus.RUNNING, 0.1))
    assert sorted(store.interrupted_solves()) == ["a", "c"]


def test_deployments_and_profiling_documents_round_trip(store: Store) -> None:
    store.add_job("a", _spec())
    assert store.deployment("a") is None and store.profiling("a") is None
    doc = {"deployment": {"kind": "plan", "indices": [1, 0]}, "overrides": {"1": 2}, "x": None}
    store.put_deployment("a", 7, doc)
    store.put_deployment("a", 8, {**doc, "x": 1.5})
    assert store.deployment("a") == (8, {**doc, "x": 1.5})
    store.put_profiling("a", {"status": "running", "steps": [1410, 1395]})
    assert store.profiling("a") == {"status": "running", "steps": [1410, 1395]}


def test_ranks_round_trip_by_global_rank(store: Store) -> None:
    store.add_job("a", _spec(data_parallel=2))
    for g in (3, 0, 2, 1):
        store.put_rank(_rank("a", g))
    assert store.ranks("a") == [_rank("a", g) for g in range(4)]
    store.put_rank(_rank("a", 1, rank_id="a-1-again"))  # the slot re-registered
    assert [r.rank_id for r in store.ranks("a")] == ["a-0", "a-1-again", "a-2", "a-3"]
    assert store.ranks("other") == []


def test_iterations_keep_the_newest_per_rank_oldest_first(store: Store) -> None:
    store.add_job("a", _spec())
    store.add_iterations("a", [("r0", i, 1.0 + i, 10.0 * i, 1) for i in range(3)], keep=4)
    store.add_iterations("a", [("r1", 0, 9.0, 9.0, 1)], keep=4)
    store.add_iterations("a", [("r0", i, 1.0 + i, 10.0 * i, 2) for i in range(3, 6)], keep=4)
    assert store.iterations("r0", 10) == [
        (i, 1.0 + i, 10.0 * i, 1 if i < 3 else 2) for i in (2, 3, 4, 5)
    ]
    assert store.iterations("r0", 2) == [(4, 5.0, 40.0, 2), (5, 6.0, 50.0, 2)]
    assert store.iterations("r1", 10) == [(0, 9.0, 9.0, 1)]
    store.add_iterations("a", [], keep=4)  # nothing to add: nothing changes
    assert len(store.iterations("r0", 10)) == 4


def test_report_sequences_only_rise_per_incarnation(store: Store) -> None:
    store.add_job("a", _spec())
    assert store.report_sequences("a") == {}
    store.add_iterations("a", [("r0", 1, 1.0, 1.0, 1)], keep=8, sequences={("r0", 7): 5})
    store.add_iterations("a", [("r1", 1, 1.0, 1.0, 1)], keep=8, sequences={("r1", 7): 2})
    store.add_iterations("a", [("r0", 2, 1.0, 1.0, 1)], keep=8, sequences={("r0", 7): 3})
    # a new incarnation of r0 (a restarted client) starts its own sequence space
    store.add_iterations("a", [("r0", 3, 1.0, 1.0, 1)], keep=8, sequences={("r0", 9): 1})
    assert store.report_sequences("a") == {"r0": {7: 5, 9: 1}, "r1": {7: 2}}
    assert store.report_sequences("b") == {}


def test_credentials_round_trip_rotate_and_revoke(store: Store) -> None:
    store.add_job("a", _spec())
    read = store.add_credential("c-read", "read", None, "h1")
    rank = store.add_credential("c-rank", "rank", "a", "h2")
    assert (read.id, read.scope, read.job_id, read.hash) == ("c-read", "read", None, "h1")
    assert read.rotated is None and read.revoked is None
    got = store.credential_by_hash("h2")
    assert got is not None and (got.id, got.scope, got.job_id) == ("c-rank", "rank", "a")
    assert got.created == rank.created
    assert store.credential_by_hash("nope") is None and _credential(store, "nope") is None
    assert [c.id for c in store.credentials()] == ["c-read", "c-rank"]
    assert [c.id for c in store.credentials("a")] == ["c-rank"]

    store.rotate_credential("c-rank", "h3")
    assert store.credential_by_hash("h2") is None
    rotated = _credential(store, "c-rank")
    assert rotated is not None and rotated.hash == "h3" and rotated.rotated is not None

    assert store.revoke_credential("c-rank") is True
    assert store.revoke_credential("c-rank") is False  # already revoked
    assert store.revoke_credential("nope") is False
    revoked = store.credential_by_hash("h3")  # found, revoked or not
    assert revoked is not None and revoked.revoked is not None
    store.rotate_credential("c-rank", "h4")  # a rotation un-revokes
    again = _credential(store, "c-rank")
    assert again is not None and again.revoked is None and again.hash == "h4"


def test_tenants_round_trip_and_a_new_database_holds_the_default(store: Store) -> None:
    assert [t.id for t in store.tenants()] == [DEFAULT_TENANT]
    default = store.tenants()[0]
    assert (default.max_jobs, default.max_gpus, default.weight, default.guaranteed_watts) == (
        None,
        None,
        1.0,
        0.0,
    )
    store.put_tenant(TenantRow("team-a", 100.0, 10, 64, 2.0, 500.0))
    store.put_tenant(TenantRow("team-b", 50.0))  # older: listed before team-a
    # Oldest first: the default tenant was created when the database was (now).
    assert [t.id for t in store.tenants()] == ["team-b", "team-a", DEFAULT_TENANT]
    a = next(t for t in store.tenants() if t.id == "team-a")
    assert (a.created, a.max_jobs, a.max_gpus, a.weight, a.guaranteed_watts) == (
        100.0,
        10,
        64,
        2.0,
        500.0,
    )
    # Replacing keeps the creation time, changes the quotas.
    store.put_tenant(TenantRow("team-a", 999.0, None, 8, 1.0, 0.0))
    a = next(t for t in store.tenants() if t.id == "team-a")
    assert (a.created, a.max_jobs, a.max_gpus, a.weight, a.guaranteed_watts) == (
        100.0,
        None,
        8,
        1.0,
        0.0,
    )
    # Jobs and credentials name their tenant (default: the default tenant).
    store.add_job("j-default", _spec())
    store.add_job("j-a", _spec(), "team-a")
    assert {j.id: j.tenant for j in store.jobs()} == {"j-default": DEFAULT_TENANT, "j-a": "team-a"}
    row = store.add_credential("c-a", "tenant", None, "ha", "team-a")
    assert row.tenant == "team-a"
    got = store.credential_by_hash("ha")
    assert got is not None and (got.scope, got.tenant, got.job_id) == ("tenant", "team-a", None)
    store.add_credential("c-b", "tenant-read", None, "hb", "team-b")
    store.add_credential("c-r", "read", None, "hr")
    cluster_read = _credential(store, "c-r")
    assert cluster_read is not None and cluster_read.tenant is None
    # Deleting a tenant forgets it and its credentials, nothing else.
    assert store.delete_tenant("team-b") is True
    assert store.delete_tenant("team-b") is False and store.delete_tenant("nope") is False
    assert "team-b" not in [t.id for t in store.tenants()]
    assert _credential(store, "c-b") is None and _credential(store, "c-a") is not None
    assert _credential(store, "c-r") is not None


def test_a_rolled_back_tenant_is_not_there(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction():
        store.put_tenant(TenantRow("gone", 1.0))
        store.add_job("j", _spec(), "gone")
        raise RuntimeError("boom")
    assert "gone" not in [t.id for t in store.tenants()] and store.jobs() == []


def test_rank_bindings_keep_the_first_credential(store: Store) -> None:
    store.add_job("a", _spec())
    assert store.slot_binding("a", 0) is None and store.rank_binding("r0") is None
    assert store.bind_rank("r0", "a", 0, "c1") == "c1"
    assert store.bind_rank("r0", "a", 0, "c2") == "c1"  # bound already
    assert store.bind_rank("other-id", "a", 0, "c2") == "c1"  # the slot is bound too
    assert store.slot_binding("a", 0) == "c1"
    assert store.rank_binding("r0") == ("a", "c1")
    assert store.bind_rank("r1", "a", 1, "c2") == "c2"


def test_the_power_budget_is_one_document(store: Store) -> None:
    assert store.power_budget() is None
    store.put_power_budget({"watts": 1000.0, "policy": "min_energy", "jobs": None})
    store.put_power_budget({"watts": 800.0, "policy": "min_energy", "jobs": ["a"]})
    assert store.power_budget() == {"watts": 800.0, "policy": "min_energy", "jobs": ["a"]}
    store.put_power_budget(None)
    assert store.power_budget() is None


def test_job_lifecycles_replace_and_go_with_their_job(store: Store) -> None:
    store.add_job("a", _spec())
    store.add_job("b", _spec())
    assert store.job_lifecycles() == {}
    store.put_job_lifecycle("a", "active", 10.0, "created")
    store.put_job_lifecycle("a", "idle", 20.5, "no rank connected for 300 s")
    store.put_job_lifecycle("b", "finished", 30.0, "POST /jobs/b/finish")
    assert store.job_lifecycles() == {
        "a": ("idle", 20.5, "no rank connected for 300 s"),
        "b": ("finished", 30.0, "POST /jobs/b/finish"),
    }
    store.delete_job("a")
    assert store.job_lifecycles() == {"b": ("finished", 30.0, "POST /jobs/b/finish")}


# --- deletion --------------------------------------------------------------------------------


def test_deleting_a_job_forgets_everything_of_it_and_nothing_else(store: Store) -> None:
    for j in ("a", "b"):
        store.add_job(j, _spec())
        store.put_profile(j, f"csv {j}", "upload")
        store.put_frontier(j, FrontierRow(SolveStatus.RUNNING, 0.5))
        store.put_deployment(j, 1, {"job": j})
        store.put_rank(_rank(j, 0))
        store.add_iterations(j, [(f"{j}-0", 1, 1.0, 1.0, 1)], keep=8, sequences={(f"{j}-0", 1): 1})
        store.put_profiling(j, {"job": j})
        store.add_credential(f"cred-{j}", "rank", j, f"hash-{j}")
        store.bind_rank(f"{j}-0", j, 0, f"cred-{j}")
    store.delete_job("a")
    assert [j.id for j in store.jobs()] == ["b"] and len(store.jobs()) == 1
    assert store.profile("a") is None and store.deployment("a") is None
    assert _frontier_fields(store.frontier("a")) == _frontier_fields(FrontierRow())
    assert store.ranks("a") == [] and store.iterations("a-0", 8) == []
    assert store.report_sequences("a") == {} and store.profiling("a") is None
    assert _credential(store, "cred-a") is None and store.credentials("a") == []
    assert store.rank_binding("a-0") is None and store.slot_binding("a", 0) is None
    assert store.interrupted_solves() == ["b"]
    # b is untouched
    assert store.profile("b") == ("csv b", 1, "upload") and store.deployment("b") == (
        1,
        {"job": "b"},
    )
    assert [r.rank_id for r in store.ranks("b")] == ["b-0"]
    assert store.iterations("b-0", 8) == [(1, 1.0, 1.0, 1)]
    assert store.rank_binding("b-0") == ("b", "cred-b")
    # The id can be used again.
    store.add_job("a", _spec(name="new"))
    assert store.profile("a") is None


# --- a database that outlives its store --------------------------------------------------------


def test_everything_written_is_there_after_a_reopen(backend: Backend, tmp_path: Path) -> None:
    if backend.reopen is None:
        pytest.skip(f"{backend.name} does not outlive its store")
    store = backend.open(tmp_path)
    store.add_job("a", _spec(name="persisted"))
    store.put_profile("a", "csv", "upload")
    store.put_rank(_rank("a", 0))
    store.put_deployment("a", 3, {"k": [1, 2]})
    store.add_credential("c", "read", None, "h")
    store.close()
    again = backend.reopen(tmp_path)
    try:
        assert [j.spec.name for j in again.jobs()] == ["persisted"]
        assert again.profile("a") == ("csv", 1, "upload")
        assert again.ranks("a") == [_rank("a", 0)]
        assert again.deployment("a") == (3, {"k": [1, 2]})
        assert again.credential_by_hash("h") is not None
    finally:
        again.close()


def test_a_first_release_database_opens_with_its_data(backend: Backend, tmp_path: Path) -> None:
    if backend.old_database is None:
        pytest.skip(f"{backend.name} has no database of an older release")
    backend.old_database(tmp_path)
    store = backend.open(tmp_path)
    try:
        assert [j.id for j in store.jobs()] == [JOB]
        assert [r.rank_id for r in store.ranks(JOB)] == [RANK]
        assert [it[0] for it in store.iterations(RANK, 10)] == [7, 8]
        # What later versions added is there, empty.
        assert store.report_sequences(JOB) == {} and store.credentials() == []
        assert store.power_budget() is None and store.frontier(JOB).partial is False
        store.add_credential("c", "rank", JOB, "h")  # and writable
        assert [c.id for c in store.credentials(JOB)] == ["c"]
        # Its jobs belong to the default tenant, which the migration created.
        assert [j.tenant for j in store.jobs()] == [DEFAULT_TENANT]
        assert [t.id for t in store.tenants()] == [DEFAULT_TENANT]
    finally:
        store.close()


def test_a_newer_database_is_refused(backend: Backend, tmp_path: Path) -> None:
    if backend.newer_database is None or backend.reopen is None:
        pytest.skip(f"{backend.name} has no database of a newer release")
    backend.open(tmp_path).close()
    backend.newer_database(tmp_path)
    with pytest.raises(StoreError, match="newer"):
        backend.reopen(tmp_path)
