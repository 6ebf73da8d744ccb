"""The examples in ``examples/`` run as a newcomer runs them, from the repository root.

``core_api.py`` is the README's "Python API" block (and runs). The online profiling example is
one command that starts a real ``perseus serve`` and two ``torch.distributed.pipelining`` ranks
over gloo on simulated GPUs; its short form must end with the measured profile equal to the
simulated GPUs' model, the frontier solved and its plan deployed and used by both ranks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
#: The clocks the short form scans: every 12th of the A100 profile's, from the top.
SHORT_CLOCKS = [1410, 1230, 1050, 870]


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1"}
    env.pop("RANK", None)  # the example's launcher mode
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _readme_block(heading: str) -> str:
    """The first ``python`` code block after ``heading`` in the README."""
    text = (ROOT / "README.md").read_text()
    m = re.search(re.escape(heading) + r"\n.*?```python\n(.*?)```", text, re.S)
    assert m, f"no python block under {heading!r} in README.md"
    return m.group(1)


def _code_after_docstring(path: Path) -> str:
    text = path.read_text()
    m = re.match(r'"""(.*?)"""\n\n', text, re.S)
    assert m, f"{path.name} starts with a docstring"
    return text[m.end() :]


def test_core_api_example_is_the_readme_block() -> None:
    assert _code_after_docstring(EXAMPLES / "core_api.py") == _readme_block("## Python API")


def test_core_api_example_runs() -> None:
    out = _run("examples/core_api.py", timeout=600)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.startswith("T0 ") and "fastest plan" in first
    assert second.startswith("FrontierPoint(time=")


def _example_module() -> ModuleType:
    path = EXAMPLES / "torch_pipelining_online_profiling.py"
    spec = importlib.util.spec_from_file_location("online_profiling_example", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_launcher_hands_its_own_server_to_the_ranks() -> None:
    mod = _example_module()
    argv = ["--short", "--server", "http://h:1", "--grpc=h:2", "--train-steps", "3"]
    assert mod._without_options(argv, ("--server", "--grpc")) == ["--short", "--train-steps", "3"]


def test_the_time_scale_leaves_room_for_the_real_work() -> None:
    """The shortest simulated instruction lasts at least 10 ms of wall time."""
    from perseus.profiles import load_profile

    mod = _example_module()
    profile = load_profile(mod.PROFILE)
    shortest = min(min(p.times) for (s, _), p in profile.entries.items() if s < mod.STAGES)
    assert shortest * mod.TIME_SCALE >= 0.010


@pytest.mark.slow
def test_online_profiling_example_short(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    summary_path = tmp_path / "summary.json"
    out = _run(
        "examples/torch_pipelining_online_profiling.py",
        "--short",
        "--summary",
        str(summary_path),
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert summary["state"] == "ready"
    prog = summary["profiling"]
    assert prog["status"] == "done" and prog["error"] is None
    assert prog["frequencies"] == SHORT_CLOCKS
    assert [e["frequency"] for e in prog["energy_per_iteration"]] == SHORT_CLOCKS
    assert prog["warmup_iterations"] == 1 and prog["iterations_per_frequency"] == 2
    # Two stages x (forward, backward) x four clocks, each equal to the simulated GPUs' model.
    assert summary["measured_rows"] == 16 and summary["measured_clocks"] == SHORT_CLOCKS
    # The hooks timed the P2P transfers of the one boundary: online profiling kept them.
    assert summary["measured_transfer_rows"] > 0
    assert summary["worst_time_deviation"] < 0.05
    assert summary["worst_energy_deviation"] < 0.01
    # Finishing solved the frontier and deployed its fastest plan by itself.
    frontier, plan = summary["frontier"], summary["plan"]
    assert frontier["status"] == "done" and frontier["num_points"] > 1
    assert plan["kind"] == "plan" and plan["pipelines"][0]["index"] == 0
    assert {r["global_rank"] for r in summary["ranks"]} == {0, 1}
    assert all(r["connected"] for r in summary["ranks"])
    trained = re.findall(r"rank (\d): trained 5 steps on plan version (\d+)", out.stdout)
    assert sorted(trained) == [("0", str(plan["version"])), ("1", str(plan["version"]))]
