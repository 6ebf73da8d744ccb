"""``benchmarks/profiling.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import re

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_profiling_benchmark_transfers_smoke() -> None:
    pytest.importorskip("torch")
    out = run("profiling.py", "--smoke")
    rows = re.findall(
        r"^A100 2x2\s+(none|fitted|per clock)\s+((?:-?\d+\.\d+ / ){3}-?\d+\.\d+)\s+"
        r"((?:-?\d+\.\d+ / ){3}-?\d+\.\d+)\s+(\d+\.\d+)",
        out,
        re.M,
    )
    assert [r[0] for r in rows] == ["none", "fitted", "per clock"], out
    for variant, got, truth, diff in rows:
        got_pts = [float(x) for x in got.split(" / ")]
        true_pts = [float(x) for x in truth.split(" / ")]
        # The printed difference is the largest over the four deadlines.
        largest = max(abs(a - b) for a, b in zip(got_pts, true_pts, strict=True))
        assert abs(float(diff) - largest) <= 0.011, variant
    links = re.findall(
        r"link 0/(\w+)\s+truth (\d+\.\d+) ms; per-clock medians (\d+\.\d+)-(\d+\.\d+) ms; "
        r"z (\S+) -> (per clock|one time (\d+\.\d+) ms)",
        out,
    )
    assert sorted(link[0] for link in links) == ["backward", "forward"], out
    for _, truth, lo, hi, _z, _fit, one in links:
        assert float(truth) > 0 and float(lo) <= float(hi)
        if one:  # one time: the median of every sample, so within the per-clock medians
            assert float(lo) - 0.001 <= float(one) <= float(hi) + 0.001
