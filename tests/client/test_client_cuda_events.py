"""The CUDA-event path, with a stand-in torch whose events record where they were waited on."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from perseus_client import NvmlGpu, PerseusClient


class FakeEvent:
    created: list[FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing
        self.t: float | None = None
        self.waited_in: list[str] = []
        FakeEvent.created.append(self)

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        self.waited_in.append(threading.current_thread().name)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1000.0


@pytest.fixture
def fake_torch(monkeypatch):
    FakeEvent.created = []
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: True,
        is_initialized=lambda: True,
        synchronize=lambda: None,
        Event=FakeEvent,
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def test_clock_changes_wait_on_the_previous_instructions_end_event(fake_torch, fake_nvml, plan_of):
    nvml = fake_nvml()
    client = PerseusClient(offline=True, gpu=NvmlGpu(0, nvml=nvml), handle_signals=False)
    assert client._cuda_events  # auto-detected: a real GPU backend and torch with CUDA
    client.use_plan(plan_of(1, [("forward", 0, 1200), ("backward", 0, 1005)]))
    with client.iteration():
        with client.instruction("forward", microbatch=0):
            pass
        end_of_forward = client._path.last_end_ev
        with client.instruction("backward", microbatch=0):
            pass
    client.controller.flush()
    # The change to 1005 MHz waited, in the controller thread, for the forward's end event.
    assert end_of_forward.waited_in and all(
        name in ("perseus-clock", threading.current_thread().name)
        for name in end_of_forward.waited_in
    )
    assert nvml.state["calls"][-1] == ("set", 1005, 1005)
    # Instruction times come from event pairs, resolved off the training thread.
    rec = client.last_report
    assert len(rec.cuda_events) == 2
    resolved = rec.resolved()
    assert all(m.time >= 0 for m in resolved.instructions) and not resolved.cuda_events
    client.close()
    assert nvml.state["locked"] is None


class GatedEvent(FakeEvent):
    """A CUDA event of a GPU that lags the CPU: ``synchronize`` returns once ``gate`` is set."""

    gate = threading.Event()

    def synchronize(self) -> None:
        super().synchronize()
        assert GatedEvent.gate.wait(5)


def test_a_sample_is_attributed_to_the_instruction_whose_lock_is_applied(
    fake_torch, fake_nvml, plan_of
):
    fake_torch.cuda.Event = GatedEvent
    GatedEvent.gate.set()
    nvml = fake_nvml()
    nvml.NVML_CLOCK_SM = 1
    nvml.sm = 1410
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: nvml.sm
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0
    client = PerseusClient(
        offline=True, gpu=NvmlGpu(0, nvml=nvml), handle_signals=False, clock_sample_interval=100.0
    )
    sampler = client.clock_sampler
    assert client._cuda_events and sampler is not None
    sampler.settle = 0.0
    client.use_plan(plan_of(1, [("forward", 0, 1410), ("backward", 0, 1005)]))
    try:
        with client.iteration():
            with client.instruction("forward", microbatch=0):
                deadline = time.monotonic() + 5
                while client.controller.lock_state().mhz != 1410 and time.monotonic() < deadline:
                    time.sleep(0.001)
                GatedEvent.gate.clear()  # the GPU will not finish the forward for a while
            with client.instruction("backward", microbatch=0):
                # The CPU issued the backward; the GPU still runs the forward at its lock of 1410.
                nvml.sm = 1005
                assert sampler.sample()
                GatedEvent.gate.set()
        report = client.last_report
        assert report is not None and report.applied_clocks is not None
        [off] = report.applied_clocks.off_plan
        assert (off.kind, off.locked_mhz, off.sampled_mhz) == ("forward", 1410, 1005)
    finally:
        GatedEvent.gate.set()
        client.close()
