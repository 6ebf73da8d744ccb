"""``benchmarks/power_floor_gpu.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


def test_power_floor_gpu_check_smoke() -> None:
    res: dict[str, Any] = json.loads(run("power_floor_gpu.py", "--smoke"))
    assert res["floor_unavailable"] is None and res["held"] is True
    assert res["during"]["counter_w"] == pytest.approx(res["floor_w"], rel=0.05)
    assert res["before"]["counter_w"] == pytest.approx(80.0, rel=0.05)
    assert res["after"]["counter_w"] == pytest.approx(80.0, rel=0.05)


def test_power_floor_gpu_check_changes_nothing_without_apply() -> None:
    """The GPU check run on a lent or shared GPU reads only: no floor is set without --apply."""
    from benchmarks.power_floor_gpu import check
    from perseus_client import SimulatedGpu

    profile = {(0, "forward"): {1410: (0.02, 6.0)}}
    gpu = SimulatedGpu(profile, blocking_power=80.0, name="A100", max_power_limit_w=400.0)
    sets: list[float] = []
    gpu.set_power_floor = lambda watts: sets.append(watts) or True  # type: ignore[method-assign]
    res = check(gpu, 0.5, 0.05, apply=False)
    assert sets == [] and "held" not in res and res["applied"].startswith("no: read-only")
    assert res["max_power_limit_w"] == 400.0
    assert res["idle"]["counter_w"] == pytest.approx(80.0, rel=0.05)
