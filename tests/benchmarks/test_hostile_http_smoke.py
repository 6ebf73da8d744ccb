"""``benchmarks/hostile_http.py --smoke`` runs, and its rows show the fixed behaviour.

A constant series count, one 400 for a CL.TE request, ``/healthz`` answered under slow bodies,
foreign host and origin refused, an out-of-range report refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_hostile_http_figures_smoke_mode_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "hostile_http.py"), "--smoke"],
        capture_output=True, text=True, timeout=600, env=os.environ.copy(), cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split("  ", 1)[0]: line for line in out.stdout.splitlines()}
    assert "1 responses (first: HTTP/1.1 400" in rows["CL.TE request with a 8 MiB chunked body"]
    answered = re.search(r"answered (\d+)/(\d+)", rows["16 slow bodies at --max-connections 16"])
    assert answered is not None and int(answered[1]) > 0
    assert "POST /frontier 403" in out.stdout and "foreign Host 403" in out.stdout
    assert "iteration_time=1e308: INVALID_ARGUMENT" in out.stdout
