"""``benchmarks/swing.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmark_run import run


def test_swing_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "swing.json"
    text = run("swing.py", "--smoke", "--json", str(out))
    assert "A100 8 x 4" in text
    (row,) = json.loads(out.read_text())["results"]
    assert row["meets"] is True
    assert row["after"]["swing"] <= 0.30 + 1e-6
    assert row["after"]["change_100ms"] <= 0.12 * row["after"]["peak"] * (1 + 1e-6)
    # Plan and floors together never cost more than the plan plus its least floors, which
    # never cost more than the uniform floor.
    assert row["perseus_energy"] <= row["plan_floors_energy"] + 1e-6
    assert row["plan_floors_energy"] < row["uniform_energy"]
    assert row["plan"]["swing"] > 0.30 and row["solve_s"] > 0
