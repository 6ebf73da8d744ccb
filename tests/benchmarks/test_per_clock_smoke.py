"""``benchmarks/per_clock.py --smoke`` runs and prints gaps that are gaps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.per_clock import TARGETS

ROOT = Path(__file__).resolve().parents[2]


def test_the_per_clock_benchmark_smoke() -> None:
    """``benchmarks/per_clock.py --smoke`` runs to the end and prints gaps that are gaps.

    Finite, none below zero (the bound is a bound), the worst at least each target's.
    """
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "per_clock.py"), "--smoke"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| smoke-a40")]
    assert len(rows) == 1
    cells = rows[0].split("|")
    gaps = [float(x) for x in cells[3].replace("%", "").split("/")]
    worst = float(cells[4].replace("%", ""))
    assert len(gaps) == len(TARGETS)
    assert all(0 <= g <= worst for g in gaps)
    assert proc.stdout.strip().splitlines()[-1] in ("OK", "FAIL")
