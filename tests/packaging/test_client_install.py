"""A plain install of Perseus (no extras) is the light rank client, and nothing more.

Builds the project's wheel, installs it without extras into a fresh virtual environment and runs
an offline plan on a simulated GPU there; the scheduler's dependencies must not be installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What a training rank never needs: the scheduler's stack.
SCHEDULER_ONLY = ("numba", "scipy", "networkx", "fastapi", "uvicorn", "matplotlib", "pydantic")

RANK_PROGRAM = r"""
import json, sys
from perseus_client import PerseusClient, RecordingGpu, SimulatedGpu
from perseus_common.wire.values import PlanStep, PlanUpdate

csv = "stage,instruction,frequency,time,energy\n" + "\n".join(
    f"0,{k},{f},{t},{e}"
    for k, rows in {"forward": [(1410, 0.010, 3.0), (1000, 0.014, 2.4)],
                    "backward": [(1410, 0.020, 6.0), (1000, 0.028, 4.8)]}.items()
    for f, t, e in rows
) + "\n"
gpu = RecordingGpu(SimulatedGpu.from_profile_csv(csv, stage=0, blocking_power=50.0, time_scale=0))
steps = [("forward", 0, 1000), ("forward", 1, 1410), ("backward", 0, 1000), ("backward", 1, 1410)]
plan = PlanUpdate(1, tuple(PlanStep(k, m, f, 0) for k, m, f in steps))
with PerseusClient(offline=True, gpu=gpu, handle_signals=False) as client:
    client.use_plan(plan)
    for _ in range(2):
        with client.iteration():
            for k, m, _f in steps:
                with client.instruction(k, microbatch=m):
                    pass
print(json.dumps({
    "clocks": [i.mhz for i in gpu.instructions],
    "locked_after_close": gpu.locked_clock,
    "modules": sorted(m.split(".")[0] for m in sys.modules),
}))
"""


@pytest.mark.slow
def test_plain_install_is_the_light_rank_client(tmp_path: Path, project_wheel: Path) -> None:
    wheel = project_wheel
    # The fresh environment must see only what it installed, not this checkout's sources.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, cwd=tmp_path, env=env
    )

    listed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=json"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"grpcio", "protobuf", "nvidia-ml-py", "perseus"} <= installed
    assert not installed & set(SCHEDULER_ONLY), installed & set(SCHEDULER_ONLY)

    run = subprocess.run(
        [str(py), "-c", RANK_PROGRAM],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # The scheduler's commands say what to install instead of a traceback.
    cli = subprocess.run(
        [
            str(env_dir / "bin" / "perseus"),
            "frontier",
            str(ROOT / "profiles" / "x.csv"),
            "--stages",
            "1",
            "--microbatches",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert cli.returncode == 2 and "pip install 'perseus[server]'" in cli.stderr, cli.stderr
    version = subprocess.run(
        [str(env_dir / "bin" / "perseus"), "--version"], capture_output=True, text=True, env=env
    )
    assert version.returncode == 0 and version.stdout.startswith("perseus "), version.stderr
    # The node daemon needs only what the rank client has.
    gpud = subprocess.run(
        [str(env_dir / "bin" / "perseus"), "gpud", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert gpud.returncode == 0 and "--socket" in gpud.stdout, gpud.stderr
    # Every app's subcommand is listed with its line, though the scheduler is not installed
    # (each registers itself in a light module), and one that needs it says what to install.
    listed = subprocess.run(
        [str(env_dir / "bin" / "perseus"), "--help"], capture_output=True, text=True, env=env
    )
    assert listed.returncode == 0, listed.stderr
    assert "cannot be loaded" not in listed.stdout
    for line in ("run the server", "the server's store", "the whole system", "the node daemon"):
        assert line in listed.stdout, listed.stdout
    demo = subprocess.run(
        [str(env_dir / "bin" / "perseus"), "demo", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert demo.returncode == 2 and "pip install 'perseus[server]'" in demo.stderr, demo.stderr
    assert out["clocks"] == [1000, 1410, 1000, 1410] * 2
    assert out["locked_after_close"] is None
    assert not set(out["modules"]) & {"perseus", "perseus_server", "numpy", *SCHEDULER_ONLY}
