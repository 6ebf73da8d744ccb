"""``benchmarks/tenancy.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_tenancy_benchmark_smoke() -> None:
    """The starvation scenario (issue #31).

    Tenant A's slowdown stays 0 while tenant B's jobs are created, solved and never started, and
    once A is guaranteed its watts.
    """
    rows: list[dict[str, Any]] = json.loads(run("tenancy.py", "--smoke", "--json"))
    assert [r["step"][0] for r in rows] == ["0", "1", "2", "3", "4"]
    for r in (rows[0], rows[1], rows[2], rows[4]):
        assert r["A"]["slowdown"] == 0.0 and r["A"]["drawing"], r
    for r in (rows[1], rows[2]):  # never started: they draw nothing, the budget is met
        assert r["feasible"] and not r["B-1024"]["drawing"], r
    assert not rows[2]["B-10kW"]["drawing"]
    # Started, B's 10 kW-per-GPU claim counts as what its two A40s can draw (300 W each).
    assert "2-GPU job claims 10 kW/GPU" in rows[2]["step"]
    assert rows[3]["B-10kW"]["watts"] <= 600.0 + 1e-6
    assert rows[3]["A"]["slowdown"] > 0  # equal weights, no guarantee: A gives up half
