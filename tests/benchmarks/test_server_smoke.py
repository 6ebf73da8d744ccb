"""``benchmarks/server.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import re

import pytest
from benchmark_run import ROOT, run


@pytest.mark.slow
def test_server_queries_and_push_smoke() -> None:
    """``benchmarks/server.py --smoke --baseline .`` runs against itself as the baseline.

    This tree's server and the same tree run as the baseline (from its sources, by
    ``PYTHONPATH``), each solved, queried and pushed to.
    """
    out = run("server.py", "--smoke", "--baseline", str(ROOT))
    rows = dict(
        re.match(r"(\S+: .+?)  +(.+)$", line).groups()  # type: ignore[union-attr]
        for line in out.splitlines()[1:]
    )
    for name in ("this", "baseline"):
        assert re.match(r"\d+ points, job \w+$", rows[f"{name}: frontier"])
        queries = [v for k, v in rows.items() if k.startswith(f"{name}: GET /plan")]
        assert len(queries) == 2, rows
        for q in queries:
            m = re.match(r"(\d+) req/s, p50 ([\d.]+) ms, p99 ([\d.]+) ms \((\d+) requests\)", q)
            assert m, q
            assert int(m.group(4)) > 0 and float(m.group(2)) <= float(m.group(3))
        push = rows[f"{name}: push to 16 WatchPlan streams (1 client processes)"]
        assert re.match(
            r"median \d+ ms, max \d+ ms over 1 deployments \(server wrote all within [\d.]+ ms\); "
            r"0 calls retried after CANCELLED; "
            r"load ",
            push,
        ), push
