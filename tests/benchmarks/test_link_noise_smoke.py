"""``benchmarks/link_noise.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_link_noise_benchmark_smoke() -> None:
    pytest.importorskip("torch")
    res: dict[str, Any] = json.loads(run("link_noise.py", "--smoke", "--json"))
    assert set(res["links"]) == {"0/forward", "0/backward"}
    for link, r in res["links"].items():
        assert len(r["per_clock_ms"]) == 2 and r["fit_ms"] > 0, link
        # Two clocks: too few for the slope test, so one time whatever the steps measured.
        assert r["fit"] == "one time" and r["old_per_clock"] is True, link
