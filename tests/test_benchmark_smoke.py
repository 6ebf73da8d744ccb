"""Every benchmark's ``--smoke`` mode runs to the end and prints figures that make sense, so a
benchmark that breaks fails the suite (``benchmarks/client.py`` has its own test in
``tests/client/test_benchmark_client.py``; ``status_load``/``server`` and ``communication`` theirs).

Each runs as a subprocess, as a user would run it; the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(script: str, *args: str, timeout: float = 300.0) -> str:
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


def test_solver_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "solver.json"
    text = run("solver.py", "--smoke", "--json", str(out))
    assert "A100  8 stages x 4 microbatches" in text
    (row,) = json.loads(out.read_text())["results"]
    assert re.search(r"fastest plan: true T vs T0\s+\+0\.000 %", text), text
    assert (row["gpu"], row["microbatches"]) == ("a100", 4) and row["T0"] > 0 and row["E0"] > 0
    assert row["perseus"]["wall"] > 0 and row["lowtime"] == {}  # --smoke: lowtime not run
    gaps = re.findall(r"gap to lower bound at [\d.]+ T0\s+([\d.]+) %", text)
    assert len(gaps) == 4 and all(float(g) <= 0.5 for g in gaps)
    savings = [float(x) for x in re.findall(r"saving at [\d.]+ T0\s+([\d.]+) %", text)]
    assert len(savings) == 4 and savings == sorted(savings) and savings[0] > 0


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


def test_lowtime_runner_smoke() -> None:
    pytest.importorskip("lowtime")
    text = run("lowtime_runner.py", "--smoke")
    assert "8 stages x 2 microbatches" in text
    plans = re.search(r"plans: (\d+)\s+completed: (True|False)", text)
    assert plans and int(plans.group(1)) > 1
    ratios = [float(x) for x in re.findall(r"true T/T0 = ([\d.]+)", text)]
    assert len(ratios) == 2 and ratios[0] >= 1.0 - 1e-9 and ratios[1] >= ratios[0]


@pytest.mark.slow
def test_soak_smoke() -> None:
    text = run("soak.py", "--smoke")
    assert "soak: 8 s, 16 ranks in 1 processes" in text
    served = re.search(r", (\d+) reports \(", text)
    assert served and int(served.group(1)) > 0, text
    lost = re.search(r"acknowledged but lost after SIGKILL \+ restart: (\d+) of (\d+) ranks", text)
    assert lost and lost.group(1) == "0" and int(lost.group(2)) > 0, text
    memory = re.findall(r"^\s+\d+ s\s+([\d.]+)$", text, re.M)
    assert len(memory) >= 2 and all(float(m) > 0 for m in memory)


@pytest.mark.slow
def test_link_noise_benchmark_smoke() -> None:
    pytest.importorskip("torch")
    res: dict[str, Any] = json.loads(run("link_noise.py", "--smoke", "--json"))
    assert set(res["links"]) == {"0/forward", "0/backward"}
    for link, r in res["links"].items():
        assert len(r["per_clock_ms"]) == 2 and r["fit_ms"] > 0, link
        # Two clocks: too few for the slope test, so one time whatever the steps measured.
        assert r["fit"] == "one time" and r["old_per_clock"] is True, link
