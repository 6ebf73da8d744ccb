"""``benchmarks/client.py --smoke``: the hook-overhead benchmark runs every case to the end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_client_benchmark_smoke_runs_every_case() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "client.py"), "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # stdout is the JSON document alone
    cases = [r["case"] for r in doc["rows"]]
    assert cases == [
        "empty loop",
        "clock changes every instruction",
        "one clock (no-op requests)",
        "clock changes, no clock sampler",
        "clock changes, sampler every 1 ms",
        "one clock sample (sampler thread)",
    ]
    for row in doc["rows"]:
        assert math.isfinite(row["median_us"]) and row["median_us"] >= 0, row
        assert row["p99_us"] >= row["median_us"], row


def test_client_benchmark_event_check_runs_or_says_why_not() -> None:
    """``--events``: with CUDA the event timer's figures; without it, a line saying so."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "client.py"), "--events"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    if doc["cuda"]:
        assert doc["event_ms_median"] > 0 and doc["reference_ms_median"] > 0
        assert doc["repeats"] == 20
    else:
        assert "skipped" in proc.stderr and "CUDA" in doc["skipped"]
