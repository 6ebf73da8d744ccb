"""``benchmarks/failover.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_failover_benchmark_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (initdb / pg_ctl; Debian package postgresql)")
    res: dict[str, Any] = json.loads(run("failover.py", "--smoke", "--json"))
    rows = res["rounds"]
    assert [r["fault"] for r in rows] == ["SIGKILL", "SIGSTOP", "dbcut"]
    for r in rows:
        assert r["acked"] > 0 and r["lost"] == 0, r
        assert r["version_went_back"] == 0 and r["deployed_version"] >= 2, r
        # Every rank got a plan on its stream to the new leader, after it had taken over.
        assert r["ranks_with_plan"] == r["ranks"] == 16, r
        # (the ports listen a moment before /healthz is seen to answer: ready is not a bound)
        assert 0 < r["to_leader_s"] <= min(r["to_ready_s"], r["plans_max_s"]), r
    # A hung or cut-off leader stops itself once it knows it was deposed.
    assert [r["deposed_exit"] for r in rows] == [None, 3, 3]
    # One committing server per epoch: the first leader's and one per failover.
    assert len(res["commits_by_epoch"]) == 4 and res["two_leaders_in_an_epoch"] == 0
