"""``benchmarks/solver.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmark_run import run


def test_solver_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "solver.json"
    text = run("solver.py", "--smoke", "--json", str(out))
    assert "A100  8 stages x 4 microbatches" in text
    (row,) = json.loads(out.read_text())["results"]
    assert re.search(r"fastest plan: true T vs T0\s+\+0\.000 %", text), text
    assert (row["gpu"], row["microbatches"]) == ("a100", 4) and row["T0"] > 0 and row["E0"] > 0
    assert row["perseus"]["wall"] > 0 and row["lowtime"] == {}  # --smoke: lowtime not run
    gaps = re.findall(r"gap to lower bound at [\d.]+ T0\s+([\d.]+) %", text)
    assert len(gaps) == 4 and all(float(g) <= 0.5 for g in gaps)
    savings = [float(x) for x in re.findall(r"saving at [\d.]+ T0\s+([\d.]+) %", text)]
    assert len(savings) == 4 and savings == sorted(savings) and savings[0] > 0
