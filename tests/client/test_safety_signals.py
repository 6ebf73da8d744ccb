"""Clocks reset on every catchable death of a real training process, even with a hung GPU.

Each test runs a trainer in a subprocess with a state-file-backed :class:`SimulatedGpu` and checks
the file after the process is gone. A "hung GPU" is a stand-in CUDA event whose ``synchronize``
never returns: the client's clock thread blocks on it while holding its apply lock.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TRAINER = textwrap.dedent(
    """
    import signal, sys, threading, time, types

    mode, state = sys.argv[1], sys.argv[2]
    got = threading.Event()

    if mode == "usr1-app":
        def app(signum, frame):
            print("APP", flush=True)
            got.set()
        signal.signal(signal.SIGUSR1, app)
    elif mode == "hup-exit":
        def app(signum, frame):
            raise SystemExit(7)
        signal.signal(signal.SIGHUP, app)

    hung = mode.startswith("hang")
    if hung:
        class HungEvent:  # a CUDA event of a GPU that never finishes its work
            def __init__(self, enable_timing=False):
                pass
            def record(self):
                pass
            def elapsed_time(self, end):
                return 1.0
            def synchronize(self):
                print("WAITING", threading.current_thread().name, flush=True)
                threading.Event().wait()
        sys.modules["torch"] = types.SimpleNamespace(cuda=types.SimpleNamespace(
            is_available=lambda: True, is_initialized=lambda: True, synchronize=lambda: None,
            Event=HungEvent))

    from perseus_client import PerseusClient, Reporting, SimulatedGpu
    from perseus_common.wire.values import PlanStep, PlanUpdate

    class AsyncSimulatedGpu(SimulatedGpu):
        synchronous_clocks = False  # like a real GPU: the clock thread applies every change

    profile = {(0, "forward"): {1410: (0.01, 3.0), 1200: (0.012, 2.6), 1000: (0.015, 2.4)}}
    cls = AsyncSimulatedGpu if mode in ("hang-async", "hang-exit") else SimulatedGpu
    gpu = cls(profile, time_scale=0.5 if hung else 0.0, state_path=state)
    client = PerseusClient(offline=True, gpu=gpu, reporting=Reporting(cuda_events=hung))
    client.use_plan(PlanUpdate(1, (PlanStep("forward", 0, 1000, 0), PlanStep("forward", 1, 1200, 0))))
    deadline = time.monotonic() + 30
    for it in range(3 if not hung else 10_000):
        with client.iteration():
            for mb in (0, 1):
                with client.instruction("forward", microbatch=mb):
                    if it == 0 and mb == 0:
                        client.controller.flush()  # no event to wait on yet
                        print("LOCKED", gpu.locked_clock, flush=True)
                        if not hung:  # wait here for the test's signal
                            while not got.is_set() and time.monotonic() < deadline:
                                time.sleep(0.01)
                            print("AFTER", gpu.locked_clock, flush=True)
        if hung and mode == "hang-exit" and it == 3:
            break
        if time.monotonic() > deadline:
            break
    print("DONE", flush=True)
    # no client.close(): interpreter exit must still reset the clocks
    """
)

ENDING = (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGABRT)


def _child_setup() -> None:
    # Default dispositions whatever the test runner inherited (nohup ignores SIGHUP, a shell
    # without job control SIGINT), and no core files from SIGQUIT/SIGABRT.
    for sig in ENDING + (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def start(mode: str, tmp_path) -> tuple[subprocess.Popen[str], object]:
    state = tmp_path / "gpu.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, mode, str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_child_setup,
    )
    return proc, state


def read_state(state) -> dict:
    return json.loads(state.read_text())


def expect_line(proc: subprocess.Popen[str], prefix: str) -> str:
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"expected {prefix!r}, got {line!r}; stderr:\n{err}")
    return line.strip()


def finish(proc: subprocess.Popen[str], timeout: float = 10.0) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        raise AssertionError(
            f"the trainer did not end within {timeout} s; stderr:\n{err}"
        ) from None


@pytest.mark.parametrize("sig", ENDING, ids=lambda s: s.name)
def test_ending_signals_reset_clocks_and_the_process_dies_of_them(tmp_path, sig):
    proc, state = start("signal", tmp_path)
    assert expect_line(proc, "LOCKED") == "LOCKED 1000"
    assert read_state(state)["locked_clock_mhz"] == 1000
    proc.send_signal(sig)
    out, err = finish(proc)
    assert proc.returncode == -sig, err  # still dies of the signal, as supervisors expect
    doc = read_state(state)
    assert doc["locked_clock_mhz"] is None and doc["resets"] >= 1
    assert "AFTER" not in out and "DONE" not in out


def test_an_application_handler_is_chained_and_clock_control_resumes(tmp_path):
    proc, state = start("usr1-app", tmp_path)
    assert expect_line(proc, "LOCKED") == "LOCKED 1000"
    proc.send_signal(signal.SIGUSR1)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    lines = out.split()
    # Reset before the application's handler ran; after it returned, the next iteration locks
    # its clocks again; interpreter exit resets at the end.
    assert out.splitlines()[:2] == ["APP", "AFTER None"]
    assert "DONE" in lines
    doc = read_state(state)
    assert doc["locked_clock_mhz"] is None and doc["resets"] >= 2 and doc["sets"] >= 5


def test_an_application_handler_that_exits_keeps_its_status(tmp_path):
    proc, state = start("hup-exit", tmp_path)
    assert expect_line(proc, "LOCKED") == "LOCKED 1000"
    proc.send_signal(signal.SIGHUP)
    out, err = finish(proc)
    assert proc.returncode == 7, err
    assert read_state(state)["locked_clock_mhz"] is None and "DONE" not in out


@pytest.mark.parametrize("mode", ["hang-async", "hang-sync"])
def test_sigterm_resets_and_ends_a_process_whose_gpu_hangs(tmp_path, mode):
    proc, state = start(mode, tmp_path)
    assert expect_line(proc, "LOCKED") == "LOCKED 1000"
    waiting = expect_line(proc, "WAITING")  # a thread now waits forever on a CUDA event
    if mode == "hang-async":
        assert waiting == "WAITING perseus-clock"
    time.sleep(0.1)
    assert read_state(state)["locked_clock_mhz"] == 1000
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc)  # before the fix: the reset waited forever on the clock thread's lock
    assert proc.returncode == -signal.SIGTERM, err
    assert time.monotonic() - t0 < 5.0
    assert read_state(state)["locked_clock_mhz"] is None


def test_interpreter_exit_resets_while_the_clock_thread_hangs(tmp_path):
    proc, state = start("hang-exit", tmp_path)
    assert expect_line(proc, "LOCKED") == "LOCKED 1000"
    assert expect_line(proc, "WAITING") == "WAITING perseus-clock"
    out, err = finish(proc)
    assert proc.returncode == 0 and "DONE" in out, err
    assert read_state(state)["locked_clock_mhz"] is None
