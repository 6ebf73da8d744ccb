"""``benchmarks/oracle_timing.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_oracle_timing_benchmark_smoke() -> None:
    """Another tenant's job and an unknown id: the same statuses in every case (not timings)."""
    rows: list[dict[str, Any]] = json.loads(run("oracle_timing.py", "--smoke", "--json"))
    assert len(rows) == 5
    for r in rows:
        assert r["status_foreign"] == r["status_unknown"] == [404], r
        assert r["requests_per_side"] == 20 and 0.0 <= r["mann_whitney_p"] <= 1.0
        assert r["median_us_foreign"] > 0 and r["median_us_unknown"] > 0
