"""``benchmarks/scaling.py --smoke`` runs (child processes and all) and prints its columns.

For both relaxation cores side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_scaling_smoke_prints_both_cores(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--smoke",
         "--relaxation", "sandwich", "--compare-sweep", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ), cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "relaxation: sandwich" in lines[0]
    assert all(k in lines[1] for k in ("relax", "round", "solves", "pivots", "wk", "sweep"))
    row = next(line for line in lines if line.startswith("a100    8 x  12"))
    assert " 192 " in row and "error" not in row
    (r,) = json.loads(out.read_text())
    assert r["relaxation"] == "sandwich" and r["solves"] >= 2 and r["pivots"] > 0
    assert set(r["stages"]) == {"first plan", "relax", "round", "search", "polish"}
    assert r["sweep"]["relaxation"] == "sweep" and r["sweep"]["solves"] is None
    # the sandwich's bound is below the exact one: its gaps read no lower, within tolerance
    assert r["gap@1.0"] >= -1e-9 and r["sweep"]["gap@1.0"] >= -1e-9


@pytest.mark.slow
def test_scaling_relax_only_compares_the_two_bounds() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--smoke", "--relax-only",
         "--relaxation", "sandwich", "--compare-sweep"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ), cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "sandwich" in lines[0] and "solves" in lines[0] and "pivots" in lines[0]
    assert "sweep" in lines[1] and "breakpoints" in lines[1]
    lo, hi = (float(x) for x in lines[2].split("[")[1].rstrip("]").split(", "))
    assert -1e-9 <= lo <= hi <= 5e-4  # the sandwich's bound: below the sweep's, within 0.05 %


@pytest.mark.slow
def test_scaling_workers_rows_carry_each_threads_cpu(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--smoke", "--workers", "1,2",
         "--relaxation", "sweep", "--transfers", "0.03", "--json", str(out),
         # the smallest pipeline, no searching: the polish of per-clock transfers works on more
         # plans the fewer the instructions, and searching adds nothing to what is checked here
         "--only", "4x4", "--effort", "0"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ), cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert all(k in lines[1] for k in ("wk", "CPU", "crit", "busiest threads"))
    rows = [line for line in lines if line.startswith("a100    4 x   4")]
    assert len(rows) == 2 and all("relax" in row and "round" in row for row in rows)
    one, two = json.loads(out.read_text())
    assert (one["workers"], two["workers"]) == (1, 2)
    for r in (one, two):
        assert r["transfers"] == 0.03 and r["effort"] == 0.0
        assert set(r["threads"]) == {"first plan", "relax", "round", "search", "polish"}
        for used in r["threads"].values():
            assert used == sorted(used, reverse=True) and all(c >= 0 for c in used)
        # the critical path: each stage's busiest thread, never more than all threads' CPU
        busiest = sum(used[0] for used in r["threads"].values() if used)
        # (each figure is printed to 0.01 s, so their sum may differ from the total's rounding)
        assert r["critical"] == pytest.approx(busiest, abs=0.005 * (len(r["threads"]) + 1))
        assert r["critical"] <= r["cpu"] + 0.05
    # the same plans either way: the two relaxations on two threads change nothing
    assert one["points"] == two["points"] and one["gap@1.0"] == pytest.approx(two["gap@1.0"])
