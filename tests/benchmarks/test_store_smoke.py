"""``benchmarks/store.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

from benchmark_run import run


def test_store_benchmark_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    res: dict[str, Any] = json.loads(run("store.py", "--smoke", "--json"))
    assert (res["ranks"], res["reports_per_rank"]) == (32, 5)
    stores = ["sqlite"] + (
        ["postgresql", "postgresql-on-loop"] if postgres_binaries() is not None else []
    )
    for name in stores:
        r = res[name]
        assert r["reports"] == 160 and r["reports_per_s"] > 0, name
        assert 0 < r["ack_ms_p50"] <= r["ack_ms_p99"], name
    if "postgresql" in res:
        # One commit per report on the loop; the writer groups the reports that wait together.
        assert res["postgresql-on-loop"]["commits"] == 160
        assert res["postgresql"]["commits"] < 160
