"""Clocks are reset on every exit path of a real training process, and the import is light."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

TRAINER = textwrap.dedent(
    """
    import sys
    from perseus_client import PerseusClient, SimulatedGpu
    from perseus_common.wire.values import PlanStep, PlanUpdate

    mode, state = sys.argv[1], sys.argv[2]
    profile = {(0, "forward"): {1410: (0.01, 3.0), 1000: (0.015, 2.4)}}
    gpu = SimulatedGpu(profile, time_scale=200.0 if mode in ("sigterm", "sigint") else 0.0,
                       state_path=state)
    client = PerseusClient(offline=True, gpu=gpu)
    client.use_plan(PlanUpdate(1, (PlanStep("forward", 0, 1000, 0),)))
    for it in range(3):
        with client.iteration():
            with client.instruction("forward", microbatch=0):
                print("LOCKED", gpu.locked_clock, flush=True)
                if mode == "exception" and it == 1:
                    raise RuntimeError("loss is NaN")
    print("DONE", flush=True)
    # no client.close(): interpreter exit must still reset the clocks
    """
)


def _default_sigint() -> None:
    # A shell without job control starts background jobs with SIGINT ignored, and children
    # inherit that; a trainer run from a terminal has the default handler (KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(mode, tmp_path):
    state = tmp_path / "gpu.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, mode, str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    return proc, state


@pytest.mark.parametrize(("mode", "sig"), [("sigterm", signal.SIGTERM), ("sigint", signal.SIGINT)])
def test_signal_mid_iteration_resets_clocks(tmp_path, mode, sig):
    proc, state = start(mode, tmp_path)
    line = proc.stdout.readline()  # the process is inside a 3-second instruction at 1000 MHz
    assert line.strip() == "LOCKED 1000", proc.stderr.read()
    assert json.loads(state.read_text())["locked_clock_mhz"] == 1000
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    if sig == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM  # still dies of SIGTERM, as supervisors expect
    else:
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
    doc = json.loads(state.read_text())
    assert doc["locked_clock_mhz"] is None and doc["resets"] >= 1
    assert "DONE" not in out


def test_exception_in_training_resets_clocks(tmp_path):
    proc, state = start("exception", tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "loss is NaN" in err
    assert out.count("LOCKED 1000") == 2
    assert json.loads(state.read_text())["locked_clock_mhz"] is None


def test_interpreter_exit_without_close_resets_clocks(tmp_path):
    proc, state = start("exit", tmp_path)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "DONE" in out
    doc = json.loads(state.read_text())
    assert doc["locked_clock_mhz"] is None and doc["resets"] == 1


def test_import_is_light():
    code = (
        "import sys, perseus_client, perseus_client.gpu, perseus_client.transport\n"
        "heavy = [m for m in ('scipy', 'networkx', 'fastapi', 'uvicorn', 'perseus.problem',"
        " 'perseus.solver', 'perseus.profiles', 'torch', 'matplotlib') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    ).stdout
    assert out.strip() == "[]"
