"""``benchmarks/solve_load.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json

import pytest
from benchmark_run import ROOT, run


@pytest.mark.slow
def test_solve_load_smoke() -> None:
    """``benchmarks/solve_load.py --smoke``: idle and solving rows, every probe answered.

    Against this tree as its own baseline too (the ``--baseline`` path runs another tree's
    server from its sources).
    """
    rows = json.loads(run("solve_load.py", "--smoke", "--json", "--baseline", str(ROOT)))
    assert [(r["server"].split()[0], r["phase"]) for r in rows] == [
        ("this", "idle"), ("this", "solving"), ("baseline", "idle"), ("baseline", "solving"),
    ]  # fmt: skip
    for r in rows:
        assert r["failed"] == 0, r["server"]
        assert r["healthz"] and r["plan"], "a phase with no probes"
        assert min(r["healthz"] + r["plan"]) > 0
        solving = r["phase"] == "solving"
        assert (r["solve_wall"] is not None and r["solve_wall"] > 0) == solving
        assert (r["solve_cpu"] is not None and r["solve_cpu"] > 0) == solving
