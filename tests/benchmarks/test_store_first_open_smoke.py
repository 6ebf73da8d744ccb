"""``benchmarks/store_first_open.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess): new processes opening a store on a new SQLite
database, the schema written directly against Alembic's history, side by side. The checks read
its JSON, never its timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

from benchmark_run import run


def test_store_first_open_benchmark_smoke() -> None:
    res: dict[str, Any] = json.loads(run("store_first_open.py", "--smoke", "--json"))
    assert res["samples"] == 2
    rows = res["sqlite"]
    for mode in ("direct", "history", "at_head"):
        assert 0 < rows[mode]["open_s"] < rows[mode]["process_s"], (mode, rows[mode])
    assert all(v > 0 for v in rows["history_over_direct"].values()), rows
    assert "postgresql" not in res
