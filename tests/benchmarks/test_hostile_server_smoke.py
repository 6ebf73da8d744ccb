"""``benchmarks/hostile_server.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_hostile_server_benchmark_smoke() -> None:
    rows: dict[str, Any] = json.loads(run("hostile_server.py", "--smoke", "--json"))
    selection = rows["stage selection, 6 ranges of 100,000"]
    assert selection["status"] == 422 and selection["field"] == "stages"
    flood = rows["2 + 1 reports of 10000 transfers"]
    assert flood["one_report"].startswith("INVALID_ARGUMENT: transfers:")
    framed = rows["a rank times a link it does not end"]["rank 0 times boundary 2"]
    assert framed.startswith("INVALID_ARGUMENT: transfers.boundary:")
    token = rows["token file swapped for a link to another user's 0600 file"]
    assert token.get("skipped") or token == {"old token": 200, "the other user's token": 401}
    disk = rows["database on a full 3 MiB file system"]
    if not disk.get("skipped"):
        assert disk["POST /jobs"].startswith("503 Retry-After=")
        assert disk["ReportIterations"].startswith("UNAVAILABLE")
        assert disk["after space returns"] == 201
    assert rows["wall clock stepped back 3600 s"] == {
        "state 3 s after the last rank left, after a -3600 s step": "idle"
    }
