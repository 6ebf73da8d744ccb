"""``benchmarks/power.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

from benchmark_run import run


def test_power_benchmark_smoke() -> None:
    text = run("power.py", "--smoke")
    rows = [line for line in text.splitlines() if line.startswith("| A100 8×4 |")]
    assert len(rows) == 5  # one per budget
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        perseus, bound, gap = float(cells[3]), float(cells[5]), float(cells[6])
        assert perseus >= bound - 1e-9 and gap >= 0  # the bound certifies Perseus's choice
        assert perseus <= float(cells[7].split()[0]) + 1e-9  # no slower than a power limit
        assert cells[-1] == "yes"
