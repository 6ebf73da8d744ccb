"""``benchmarks/tenant_fairness.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_tenant_fairness_benchmark_smoke() -> None:
    """Fairness between tenants (issue #39): what team B's credential does to team A."""
    out: dict[str, Any] = json.loads(run("tenant_fairness.py", "--smoke", "--json", timeout=900))
    churn = out["churn"]
    assert churn["redeploys"] <= 1 + 2 * (churn["seconds"] / 0.5 + 1), churn  # merged, not 10
    assert churn["received"] <= churn["redeploys"] + 1, churn
    phantom = out["phantom"]
    assert phantom["a_after"] == phantom["a_before"] and phantom["b_demand"] == 0.0, phantom
    assert out["backlog"]["a_answer"] == 202, out["backlog"]
    assert out["quota"]["fifth_first_job"] == 201, out["quota"]
    assert out["streams"]["open"] == out["streams"]["cap"], out["streams"]
    writes = out["writes"]
    assert writes["a_write"] == 201 and writes["refused_429"] > 0, writes
