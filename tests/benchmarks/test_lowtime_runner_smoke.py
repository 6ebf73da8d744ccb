"""``benchmarks/lowtime_runner.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import re

import pytest
from benchmark_run import run


def test_lowtime_runner_smoke() -> None:
    pytest.importorskip("lowtime")
    text = run("lowtime_runner.py", "--smoke")
    assert "8 stages x 2 microbatches" in text
    plans = re.search(r"plans: (\d+)\s+completed: (True|False)", text)
    assert plans and int(plans.group(1)) > 1
    ratios = [float(x) for x in re.findall(r"true T/T0 = ([\d.]+)", text)]
    assert len(ratios) == 2 and ratios[0] >= 1.0 - 1e-9 and ratios[1] >= ratios[0]
