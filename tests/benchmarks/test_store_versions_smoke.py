"""``benchmarks/store_versions.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess): the one store against the stores of ``e4f82c6``,
side by side. The checks read its JSON, never its timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

from benchmark_run import run


def test_store_versions_benchmark_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    res: dict[str, Any] = json.loads(run("store_versions.py", "--smoke", "--json", timeout=900))
    kinds = ["sqlite"] + (["postgresql"] if postgres_binaries() is not None else [])
    for kind in kinds:
        ingest = res["measures"][f"{kind}_ingest_reports_per_s"]
        assert ingest["old"] > 0 and ingest["new"] > 0, ingest
        for measure in ("plan_query_ms", "deploy_ms", "open_ms"):
            m = res["measures"][f"{kind}_{measure}"]
            assert m["old"] > 0 and m["new"] > 0 and m["new_over_old"] > 0, (kind, measure, m)
