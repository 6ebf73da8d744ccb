"""``benchmarks/hooks.py --smoke`` runs to the end and prints figures that make sense.

Run as a user would run it (a subprocess); the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from benchmark_run import run


@pytest.mark.slow
def test_hooks_benchmark_smoke() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    res: dict[str, Any] = json.loads(run("hooks.py", "--smoke", "--json"))
    assert set(res) == {"torch", "deepspeed", "megatron"}
    for name, r in res.items():
        assert r["iterations"] == 3, name
        assert r["clocks_match_plan"] is True, f"{name}: the GPU did not run the plan's clocks"
        assert r["instructions_per_iteration"] > 0
        assert r["iteration_boundary_us_median"] > 0
        assert r["hook_us_p99"] >= r["hook_us_median"] - r["timer_floor_us"]
        assert r["step_ms_hooked_median"] > 0
        # The paired phase: 4 pairs, the median excess inside its interval.
        assert r["pairs"] == 4
        lo, hi = r["step_excess_us_per_instruction_ci95"]
        assert lo <= r["step_excess_us_per_instruction_median"] <= hi
    # 4 microbatches; torch: rank 0 holds stages 0 and 2 of 4, so its 3 boundaries (0, 1, 2)
    # are all to the other rank: 3 links x 2 directions x 4 microbatches.
    assert res["torch"]["instructions_per_iteration"] == 2 * 2 * 4
    assert res["torch"]["transfers_recorded_per_iteration"] == 24
    # DeepSpeed, 2 stages: stage 0 sends 4 activations and receives 4 gradients.
    assert res["deepspeed"]["instructions_per_iteration"] == 8
    assert res["deepspeed"]["transfers_recorded_per_iteration"] == 8
    # Megatron's schedules need CUDA for P2P: none on CPU.
    assert res["megatron"]["transfers_recorded_per_iteration"] == 0


@pytest.mark.slow
def test_hooks_benchmark_async_gpu_smoke() -> None:
    """``--gpu async``: clock locks on the controller thread, the plan's clocks still requested."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    args = ("--smoke", "--json", "--gpu", "async", "--integration", "megatron")
    res: dict[str, Any] = json.loads(run("hooks.py", *args))
    r = res["megatron"]
    assert r["iterations"] == 3 and r["pairs"] == 4
    assert r["clocks_match_plan"] is True
    assert r["hook_us_p99"] >= r["hook_us_median"] - r["timer_floor_us"]
