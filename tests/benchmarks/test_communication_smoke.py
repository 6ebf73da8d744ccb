"""``benchmarks/communication.py --smoke`` runs, prints its table, and meets its goal.

The communication-aware zero-slowdown plan on time and within 0.5 % of its bound.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_communication_benchmark_smoke() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "communication.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("| profile | schedule | transfer |")
    rows = [ln.split(" | ") for ln in lines[2:-1]]
    assert [r[1] for r in rows] == ["1f1b", "interleaved"]
    for r in rows:
        assert r[5] == "on time"  # the aware zero-slowdown plan
        assert float(r[6].rstrip(" %")) <= 0.5  # its gap to the bound at T0
    assert lines[-1] == "OK"
