"""``FailOpenGpu`` in one process.

What it does while the backend cannot be built, and how it takes over (the clock last asked for
applied, the energy counter continuous, listeners told). The real-process causes are in
``test_clock_control_failopen.py``.
"""

from __future__ import annotations

import threading
import time

import pytest
from client_data import BACKOFF_EXPECTED, BACKOFF_INITIAL, BACKOFF_MAXIMUM, RecordingEvent

from perseus_client import (
    FailOpen,
    FailOpenGpu,
    PerseusClient,
    SimulatedGpu,
)
from perseus_client.errors import (
    ConfigError,
    GpudUnavailableError,
)

PROFILE = {
    (0, "forward"): {1410: (0.01, 3.0), 1200: (0.012, 2.6), 1005: (0.015, 2.4)},
}


class Gate:
    """Builds a SimulatedGpu once ``open`` is set; raises a clock-control error before."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.calls = 0
        self.gpu: SimulatedGpu | None = None

    def __call__(self) -> SimulatedGpu:
        self.calls += 1
        if not self.open.is_set():
            raise GpudUnavailableError("cannot reach the Perseus node daemon at /x: No such file")
        self.gpu = SimulatedGpu(PROFILE, time_scale=0.0)
        self.gpu.begin_instruction("forward", 0, 0)  # its counter is not at 0 when taken over
        self.gpu.end_instruction()
        assert self.gpu.energy_mj() > 0
        return self.gpu


def wait_for(cond: object, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_unavailable_then_takes_over() -> None:
    gate = Gate()
    told: list[str] = []
    gpu = FailOpenGpu(gate, retry_initial=0.01, retry_max=0.02)
    gpu.add_listener(lambda: told.append(gpu.state))
    assert gpu.state == "unavailable" and "No such file" in str(gpu.reason)
    assert gpu.supported_clocks() == () and gpu.max_clock == 0 and gpu.name == ""
    gpu.set_locked_clocks(1200)  # remembered, nothing to apply it to
    gpu.set_locked_clocks(0)  # "the maximum clock" while it is not known: a reset
    gpu.set_locked_clocks(1005)
    assert gpu.energy_mj() == 0
    wait_for(lambda: gate.calls >= 3, "retries")
    gate.open.set()
    wait_for(lambda: gpu.state == "active", "control")
    assert told == ["active"] and gpu.recoveries == 1
    assert gate.gpu is not None and gate.gpu.locked_clock == 1005  # the clock last asked for
    assert gpu.max_clock == 1410 and gpu.supported_clocks() == (1410, 1200, 1005)
    assert gpu.energy_mj() == 0  # the counter continues from where it stood
    with pytest.raises(Exception, match="not a supported"):
        gpu.set_locked_clocks(1111)  # a user's error is not a clock-control one
    gpu.close()


def test_a_client_runs_and_learns_its_max_clock_at_an_iteration_boundary() -> None:
    gate = Gate()
    gpu = FailOpenGpu(gate, retry_initial=0.01, retry_max=0.02)
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    assert client.clock_control == "unavailable" and client.max_clock == 0
    with client.iteration(), client.instruction("forward"):
        pass
    # Listeners are told in order: once this one is, the client's (added first) has been.
    told: list[str] = []
    gpu.add_listener(lambda: told.append(gpu.state))
    gate.open.set()
    wait_for(lambda: told == ["active"], "control, and the client told")
    with client.iteration(), client.instruction("forward"):
        client.controller.flush()
    assert client.max_clock == 1410
    assert gate.gpu is not None and gate.gpu.locked_clock == 1410
    client.close()
    assert gate.gpu.locked_clock is None


def test_configuration_errors_still_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "abc")
    with pytest.raises(ConfigError) as e:
        PerseusClient(offline=True, handle_signals=False)
    assert e.value.field == "LOCAL_RANK"
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError) as e:
        PerseusClient(offline=True, handle_signals=False, fail_open=FailOpen(clock_retry_initial=0))
    assert e.value.field == "clock_retry_initial"
    with pytest.raises(ConfigError) as e:
        PerseusClient("localhost:1", None, handle_signals=False)
    assert e.value.field == "job"
    for bad in ("localhost", "scheduler:0", "scheduler:http", "a b:50051", "::1:50051"):
        with pytest.raises(ConfigError) as e:
            PerseusClient(bad, "job", handle_signals=False)
        assert e.value.field == "server" and repr(bad) in str(e.value)


def test_a_configuration_error_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    before = {t.name for t in threading.enumerate()}
    monkeypatch.setenv("PERSEUS_TLS_CA", "/nonexistent/ca.pem")
    with pytest.raises(ConfigError) as e:
        PerseusClient("localhost:50051", "job", handle_signals=False)
    assert e.value.field == "PERSEUS_TLS_CA"
    assert "perseus-clock-control" not in {t.name for t in threading.enumerate()} - before


class _Stepped(FailOpenGpu):
    def _run(self) -> None:  # its thread does nothing: the test runs the loop itself
        return


def _never() -> FailOpenGpu:
    raise GpudUnavailableError("cannot reach the Perseus node daemon at /x: No such file")


def test_clock_control_retries_double_up_to_their_maximum() -> None:
    """Doubling from the initial delay up to the maximum (issue #32), waits recorded, not slept."""
    gpu = _Stepped(_never, retry_initial=BACKOFF_INITIAL, retry_max=BACKOFF_MAXIMUM)  # type: ignore[arg-type]
    gpu._closing = RecordingEvent(len(BACKOFF_EXPECTED))
    FailOpenGpu._run(gpu)
    assert gpu._closing.waits == pytest.approx(BACKOFF_EXPECTED)
    gpu.close()
