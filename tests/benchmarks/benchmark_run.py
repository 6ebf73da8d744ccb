"""A benchmark's ``--smoke`` mode run as a user would run it, for the smoke tests beside it.

``tests/benchmarks/test_<name>_smoke.py`` runs ``benchmarks/<name>.py --smoke`` (one file per
benchmark, so the suite's workers run them side by side) and reads its table or JSON, never its
timings against a limit. So a benchmark that breaks fails the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(script: str, *args: str, timeout: float = 300.0) -> str:
    """Run ``benchmarks/<script>`` with ``args``; its standard output (it must exit 0)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, f"{script} {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return proc.stdout
