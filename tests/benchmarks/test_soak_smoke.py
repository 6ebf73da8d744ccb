"""``benchmarks/soak.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_soak_smoke() -> None:
    text = run("soak.py", "--smoke")
    assert "soak: 8 s, 16 ranks in 1 processes" in text
    served = re.search(r", (\d+) reports \(", text)
    assert served and int(served.group(1)) > 0, text
    lost = re.search(r"acknowledged but lost after SIGKILL \+ restart: (\d+) of (\d+) ranks", text)
    assert lost and lost.group(1) == "0" and int(lost.group(2)) > 0, text
    memory = re.findall(r"^\s+\d+ s\s+([\d.]+)$", text, re.M)
    assert len(memory) >= 2 and all(float(m) > 0 for m in memory)


@pytest.mark.slow
def test_soak_failover_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (initdb / pg_ctl; Debian package postgresql)")
    res: dict[str, Any] = json.loads(run("soak.py", "--failover", "--smoke", "--json"))
    rows = res["rounds"]
    assert [r["fault"] for r in rows] == ["SIGKILL", "SIGSTOP"]
    assert all(r["lost"] == 0 and r["acked"] > 0 for r in rows), rows
    assert all(r["ranks_with_plan"] == r["ranks"] == 16 for r in rows), rows
    assert [r["version_went_back"] for r in rows] == [0, 0]
    # The restarted server leads the second round: versions go on from the first's.
    assert rows[1]["deployed_version"] > rows[0]["deployed_version"]
    assert res["two_leaders_in_an_epoch"] == 0 and len(res["commits_by_epoch"]) == 3
