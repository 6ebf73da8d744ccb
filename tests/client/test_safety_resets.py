"""Resets that never wait on the clock thread, and the client's other safety rules (in-process).

Also fallback to max clocks, concurrent backend resets, the signal guard's chaining rules, and the
warning for a token sent in clear.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import threading
import time

import pytest

from perseus_client import (
    Connection,
    FrequencyController,
    NvmlGpu,
    PerseusClient,
    RecordingGpu,
    SimulatedGpu,
)
from perseus_client.errors import GpuError
from perseus_client.safety import ResetGuard, guarded_signals
from perseus_client.transport import ServerLink, credential_in_clear, is_loopback_target

PROFILE = {
    (0, "forward"): {1410: (0.010, 3.0), 1200: (0.012, 2.6), 1000: (0.015, 2.4)},
    (0, "backward"): {1410: (0.020, 6.0), 1200: (0.024, 5.2), 1000: (0.030, 4.8)},
}


class HungEvent:
    """A CUDA event of a hung GPU: ``synchronize`` returns only when the test releases it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def synchronize(self) -> None:
        self.entered.set()
        self.release.wait(30)


class RefusingGpu(SimulatedGpu):
    """A simulated GPU that refuses to lock some clocks (and optionally refuses resets)."""

    def __init__(self, refused: set[int], *, refuse_reset: bool = False) -> None:
        super().__init__(PROFILE, stage=0, time_scale=0.0)
        self.refused = refused
        self.refuse_reset = refuse_reset

    def set_locked_clocks(self, mhz: int) -> None:
        if mhz in self.refused:
            raise GpuError(f"could not lock {mhz} MHz (injected)")
        super().set_locked_clocks(mhz)

    def reset_locked_clocks(self) -> None:
        if self.refuse_reset:
            raise GpuError("could not reset (injected)")
        super().reset_locked_clocks()


class GatedSetGpu(SimulatedGpu):
    """A simulated GPU whose lock call blocks in the backend until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__(PROFILE, stage=0, time_scale=0.0)
        self.in_set = threading.Event()
        self.gate = threading.Event()

    def set_locked_clocks(self, mhz: int) -> None:
        self.in_set.set()
        self.gate.wait(30)
        super().set_locked_clocks(mhz)


def wait_for(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


# -- resets never wait on the clock thread ----------------------------------------------------------


def test_reset_now_returns_while_the_clock_thread_waits_forever_on_an_event(sim_gpu):
    ctl = FrequencyController(sim_gpu)
    ctl.request(1200)
    ctl.flush()
    ev = HungEvent()
    ctl.request(1000, after=ev)
    assert ev.entered.wait(5)  # the clock thread holds its lock, waiting on the event
    t0 = time.monotonic()
    ctl.reset_now()
    assert time.monotonic() - t0 < 1.0
    assert sim_gpu.locked_clock is None and sim_gpu.resets == 1
    ev.release.set()  # the event completes late: the dropped request must not lock the GPU
    assert wait_for(lambda: ctl.applied_seq >= 2)
    time.sleep(0.05)
    assert sim_gpu.locked_clock is None and sim_gpu.sets == 1
    ctl.close()


def test_a_lock_landing_after_a_reset_is_undone():
    gpu = GatedSetGpu()
    ctl = FrequencyController(gpu)
    seq = ctl.request(1000)
    assert gpu.in_set.wait(5)  # the lock is in flight inside the backend
    ctl.reset_now(close=False)
    assert gpu.locked_clock is None
    gpu.gate.set()  # the in-flight lock lands after the reset...
    assert wait_for(lambda: ctl.applied_seq >= seq and gpu.resets >= 2)
    assert (
        gpu.locked_clock is None
    )  # ...and the controller reset again: the reset has the last word
    ctl.close()


def test_reset_without_close_keeps_the_controller_usable(sim_gpu):
    ctl = FrequencyController(sim_gpu)
    ctl.request(1000)
    ctl.flush()
    ctl.reset_now(close=False)
    assert sim_gpu.locked_clock is None and not ctl.closed
    ctl.request(1000)  # the same clock as before the reset is applied again
    ctl.flush()
    assert sim_gpu.locked_clock == 1000
    ctl.reset_now()
    ctl.request(1200)
    ctl.flush()
    assert sim_gpu.locked_clock is None and ctl.closed
    ctl.reopen()
    ctl.request(1200)
    ctl.flush()
    assert sim_gpu.locked_clock == 1200
    ctl.close()
    assert sim_gpu.locked_clock is None


def test_exception_in_training_resets_without_waiting_for_a_hung_clock_thread(fake_nvml, plan_of):
    nvml = fake_nvml()
    client = PerseusClient(offline=True, gpu=NvmlGpu(0, nvml=nvml), handle_signals=False)
    client.use_plan(plan_of(1, [("forward", 0, 1200), ("backward", 0, 1005)]))
    ev = HungEvent()
    client.controller.request(1395)
    client.controller.flush()
    assert nvml.state["locked"] == (1395, 1395)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="NCCL timeout"), client.iteration():
        client._path.last_end_ev = ev  # the previous instruction's end event never completes
        with client.instruction("forward", microbatch=0):
            assert ev.entered.wait(5)
            raise RuntimeError("NCCL timeout")
    assert time.monotonic() - t0 < 2.0
    assert nvml.state["locked"] is None
    ev.release.set()
    client.close()
    assert nvml.state["locked"] is None


# -- a refused clock falls back to max clocks -------------------------------------------------------


def test_a_refused_clock_falls_back_to_max_and_training_goes_on(plan_of, caplog):
    gpu = RecordingGpu(RefusingGpu({1000}))
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    client.use_plan(plan_of(1, [("forward", 0, 1200), ("forward", 1, 1000), ("backward", 1, 1000)]))
    caplog.set_level(logging.ERROR, logger="perseus_client.controller")
    for _ in range(2):
        with client.iteration():
            for kind, mb in (("forward", 0), ("forward", 1), ("backward", 1)):
                with client.instruction(kind, microbatch=mb):
                    pass
    ran = [r.mhz for r in gpu.instructions]
    # Before the fix the refused 1000 MHz left the GPU at 1200 MHz; now it runs at the maximum.
    assert ran == [1200, 1410, 1410, 1200, 1410, 1410]
    assert isinstance(client.controller.last_error, GpuError)
    assert "1000 MHz" in str(client.controller.last_error)
    assert sum("could not apply" in r.message for r in caplog.records) == 1  # logged once
    client.close()
    assert gpu.locked_clock is None


def test_when_max_is_refused_too_the_lock_is_released(sim_gpu):
    gpu = RefusingGpu({1000, 1410})
    ctl = FrequencyController(gpu)
    ctl.request(1200)
    ctl.flush()
    ctl.request(1000)
    ctl.flush()
    assert gpu.locked_clock is None and gpu.resets == 1
    assert "1000 MHz" in str(ctl.last_error)
    ctl.close()


def test_a_backend_refusing_everything_never_raises_into_training(caplog):
    gpu = RefusingGpu({1000, 1200, 1410}, refuse_reset=True)
    ctl = FrequencyController(gpu)
    for f in (1200, 1000, 1410):
        ctl.request(f)
        ctl.flush()
    ctl.reset_now()
    assert isinstance(ctl.last_error, GpuError)
    ctl.close()
    assert sum("could not fall back" in r.message for r in caplog.records) == 1


# -- backends' resets are safe to call concurrently -------------------------------------------------


def _held_by_another_thread(lock):
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(5)
    return release, t


@pytest.mark.parametrize("backend", ["nvml", "simulated", "recording"])
def test_backend_reset_does_not_wait_on_a_stuck_holder_of_its_lock(backend, fake_nvml, tmp_path):
    nvml = fake_nvml()
    if backend == "nvml":
        gpu = NvmlGpu(0, nvml=nvml)
        gpu.set_locked_clocks(1200)
        lock = gpu._lock
    elif backend == "simulated":
        gpu = SimulatedGpu(PROFILE, stage=0, time_scale=0.0, state_path=tmp_path / "s.json")
        gpu.set_locked_clocks(1200)
        lock = gpu._state_lock
    else:
        gpu = RecordingGpu(SimulatedGpu(PROFILE, stage=0, time_scale=0.0))
        gpu.set_locked_clocks(1200)
        lock = gpu._lock
    release, t = _held_by_another_thread(lock)  # e.g. a lock call stuck in the driver
    t0 = time.monotonic()
    gpu.reset_locked_clocks()
    assert time.monotonic() - t0 < 2.0
    if backend == "nvml":
        assert nvml.state["locked"] is None
    elif backend == "simulated":
        assert SimulatedGpu.read_state(tmp_path / "s.json")["locked_clock_mhz"] is None
    else:
        assert gpu.locked_clock is None and gpu.inner.locked_clock is None
    release.set()
    t.join(5)


# -- the signal guard -------------------------------------------------------------------------------


def test_guarded_signals_cover_every_catchable_ending_signal():
    names = {s.name for s in guarded_signals()}
    assert {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"} <= names
    assert not names & {"SIGKILL", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL"}
    # SIGABRT only without faulthandler, whose C handler for a native abort() it would replace.
    was = faulthandler.is_enabled()
    try:
        faulthandler.enable()
        assert "SIGABRT" not in {s.name for s in guarded_signals()}
        faulthandler.disable()
        assert "SIGABRT" in {s.name for s in guarded_signals()}
    finally:
        if was:
            faulthandler.enable()


@pytest.fixture
def saved_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_guard_chains_to_the_previous_python_handler_and_resumes(saved_handlers):
    calls: list[str] = []
    signal.signal(signal.SIGUSR1, lambda s, f: calls.append("app"))
    guard = ResetGuard(lambda: calls.append("reset"), resume=lambda: calls.append("resume"))
    try:
        signal.raise_signal(signal.SIGUSR1)
        assert calls == ["reset", "app", "resume"]
    finally:
        guard.uninstall()
    signal.raise_signal(signal.SIGUSR1)  # uninstalled: the application's handler alone
    assert calls == ["reset", "app", "resume", "app"]


def test_guard_does_not_resume_when_the_previous_handler_ends_the_process(saved_handlers):
    calls: list[str] = []

    def app(signum, frame):
        raise SystemExit(7)

    signal.signal(signal.SIGHUP, app)
    guard = ResetGuard(lambda: calls.append("reset"), resume=lambda: calls.append("resume"))
    try:
        with pytest.raises(SystemExit) as info:
            signal.raise_signal(signal.SIGHUP)
        assert info.value.code == 7 and calls == ["reset"]
    finally:
        guard.uninstall()


def test_guard_leaves_ignored_signals_alone(saved_handlers):
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    guard = ResetGuard(lambda: None)
    try:
        assert signal.SIGUSR2 not in guard.installed
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        assert signal.SIGUSR1 in guard.installed
    finally:
        guard.uninstall()


def test_guard_chains_even_when_the_reset_hangs(saved_handlers, monkeypatch, caplog):
    monkeypatch.setattr(ResetGuard, "deadline_s", 0.2)
    stuck = threading.Event()
    calls: list[str] = []
    signal.signal(signal.SIGUSR1, lambda s, f: calls.append("app"))
    guard = ResetGuard(lambda: stuck.wait(30))
    try:
        t0 = time.monotonic()
        signal.raise_signal(signal.SIGUSR1)
        assert calls == ["app"] and time.monotonic() - t0 < 2.0
        assert any("did not finish" in r.message for r in caplog.records)
    finally:
        stuck.set()
        guard.uninstall()


# -- a token sent in clear --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "loopback"),
    [
        ("localhost:50051", True),
        ("LOCALHOST:1", True),
        ("rank.localhost:1", True),
        ("127.0.0.1:50051", True),
        ("127.3.2.1:50051", True),
        ("[::1]:50051", True),
        ("::1", True),
        ("ipv4:127.0.0.1:50051", True),
        ("dns:///localhost:50051", True),
        ("unix:/run/perseus.sock", True),
        ("10.255.255.1:50051", False),
        ("scheduler:50051", False),
        ("[2001:db8::1]:50051", False),
        ("dns:///scheduler.example.com:443", False),
        ("0.0.0.0:50051", False),
    ],
)
def test_loopback_targets(target, loopback):
    assert is_loopback_target(target) is loopback


def test_credential_in_clear_needs_a_token_no_tls_and_a_remote_address():
    assert credential_in_clear("10.255.255.1:50051", tls=False, token="t")
    assert not credential_in_clear("10.255.255.1:50051", tls=True, token="t")
    assert not credential_in_clear("10.255.255.1:50051", tls=False, token=None)
    assert not credential_in_clear("10.255.255.1:50051", tls=False, token="")
    assert not credential_in_clear("127.0.0.1:50051", tls=False, token="t")


def _link_warnings(caplog):
    return [r for r in caplog.records if "without TLS" in r.message]


def test_client_warns_once_when_its_token_travels_in_clear(sim_gpu, caplog):
    caplog.set_level(logging.WARNING, logger="perseus_client.transport")
    client = PerseusClient(
        "10.255.255.1:50051",
        job="j",
        token="s3cret",
        gpu=sim_gpu,
        handle_signals=False,
        connection=Connection(rpc_timeout=0.1, backoff_initial=0.05, backoff_max=0.1),
    )
    try:
        time.sleep(0.3)  # a few failed registrations: still one warning
        warnings = _link_warnings(caplog)
        assert len(warnings) == 1
        assert "10.255.255.1:50051" in warnings[0].message and "s3cret" not in warnings[0].message
    finally:
        client.close()


def test_no_warning_on_loopback_tls_or_without_a_token(sim_gpu, caplog):
    caplog.set_level(logging.WARNING, logger="perseus_client.transport")
    client = PerseusClient(
        "127.0.0.1:1",
        job="j",
        token="s3cret",
        gpu=sim_gpu,
        handle_signals=False,
        connection=Connection(rpc_timeout=0.1),
    )
    client.close()
    for kwargs in ({"tls": True}, {"token": None}):
        link = ServerLink(
            "10.255.255.1:50051",
            client.link.identity,
            lambda plan: None,
            **({"token": "s3cret"} | kwargs),
        )
        link.close(flush_timeout=0.0)
    assert _link_warnings(caplog) == []
