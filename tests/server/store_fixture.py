"""A store written by the stores of before the one store (``e4f82c6``), and what it holds.

``fixtures/store-e4f82c6.sqlite`` (a SQLite file) and ``fixtures/store-e4f82c6.postgres.sql``
(``pg_dump --inserts`` of a PostgreSQL database) were written by ``SqliteStore`` and
``PostgresStore`` at commit ``e4f82c6`` with the same calls: two jobs of two tenants, each with a
profile at revision 2, a frontier, a deployment, a profiling session, a lifecycle, two ranks of
six iterations each (the newest four kept) and two report incarnations per rank, credentials
(one rotated, one revoked), a rank binding and the power budget. :func:`assert_holds` checks that
a store opened on either, upgraded by this code, holds every one of those rows. How they were
made: ``fixtures/store-e4f82c6.make.py.txt`` (run in a checkout of ``e4f82c6``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from perseus_server.domain.states import SolveStatus

__all__ = ["COUNTS", "assert_holds", "load_postgres", "sqlite_copy"]

_HERE = Path(__file__).resolve().parent / "fixtures"

#: Rows per table as the old stores wrote them.
COUNTS = {
    "tenants": 2, "jobs": 2, "profiles": 2, "frontiers": 2, "deployments": 2, "profiling": 2,
    "job_lifecycle": 2, "ranks": 4, "iterations": 16, "report_sequences": 8, "credentials": 4,
    "rank_bindings": 2, "power_budget": 1,
}  # fmt: skip


def sqlite_copy(dst: Path) -> Path:
    """A copy of the SQLite fixture at ``dst``."""
    shutil.copyfile(_HERE / "store-e4f82c6.sqlite", dst)
    return dst


def load_postgres(url: str) -> None:
    """Restore the PostgreSQL dump into the empty database ``url``."""
    import psycopg

    lines = (_HERE / "store-e4f82c6.postgres.sql").read_text().splitlines()
    script = "\n".join(line for line in lines if not line.startswith("\\"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script)  # type: ignore[call-overload]
        conn.execute("SELECT pg_catalog.set_config('search_path', 'public', false)")


def assert_holds(store: Any) -> None:
    """Every row the fixture's stores wrote, read back through this code's store."""
    assert [(j.id, j.tenant, j.spec.name) for j in store.jobs()] == [
        ("job-a", "team-a", "fixture job-a"),
        ("job-b", "default", "fixture job-b"),
    ]
    tenants = {t.id: t for t in store.tenants()}
    assert set(tenants) == {"default", "team-a"}
    team = tenants["team-a"]
    assert (team.max_jobs, team.max_gpus, team.weight, team.guaranteed_watts) == (4, 16, 2.0, 300.0)
    for j in ("job-a", "job-b"):
        csv, revision, source = store.profile(j)
        assert (revision, source) == (2, "online") and "0.02" in csv
        front = store.frontier(j)
        assert front.status is SolveStatus.DONE and front.profile_revision == 2
        assert front.partial is (j == "job-b") and front.solve_seconds == 1.5
        assert store.deployment(j) == (3, {"version": 3, "pipelines": [{"index": 0}]})
        assert store.profiling(j) == {"state": "measuring", "job": j}
        assert [r.rank_id for r in store.ranks(j)] == [f"{j}-r0", f"{j}-r1"]
        assert store.ranks(j)[1].supported_clocks == (1740, 1410)
        for g in range(2):
            rows = store.iterations(f"{j}-r{g}", 10)
            assert [r[0] for r in rows] == [2, 3, 4, 5] and rows[0][2] == 52.0
        assert store.report_sequences(j) == {f"{j}-r{g}": {0: 5, 77: 2} for g in range(2)}
        assert store.slot_binding(j, 0) == f"cred-{j}" and store.rank_binding(f"{j}-r0") == (
            j,
            f"cred-{j}",
        )
    creds = {c.id: c for c in store.credentials()}
    assert set(creds) == {"cred-job-a", "cred-job-b", "cred-team", "cred-old"}
    assert creds["cred-team"].hash == "digest-team-2" and creds["cred-team"].rotated is not None
    assert creds["cred-old"].revoked is not None and creds["cred-team"].tenant == "team-a"
    assert store.power_budget() == {"watts": 5000, "policy": "fair"}
    assert store.job_lifecycles() == {
        "job-a": ("active", 12.5, "reports"),
        "job-b": ("active", 12.5, "reports"),
    }
    # And it goes on: a rank's next rows are numbered after its kept ones, the oldest trimmed.
    store.add_iterations(
        "job-a", [("job-a-r0", 6, 1.0, 60.0, 3)], keep=4, sequences={("job-a-r0", 0): 6}
    )
    assert [r[0] for r in store.iterations("job-a-r0", 10)] == [3, 4, 5, 6]
    assert store.report_sequences("job-a")["job-a-r0"] == {77: 2, 0: 6}
