"""The CUDA-event path, with a stand-in torch whose events record where they were waited on."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from perseus_client import NvmlGpu, PerseusClient, Reporting


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
        offline=True,
        gpu=NvmlGpu(0, nvml=nvml),
        handle_signals=False,
        reporting=Reporting(clock_sample_interval=100.0),
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
        assert (off.instruction, off.locked_mhz, off.sampled_mhz) == ("forward", 1410, 1005)
    finally:
        GatedEvent.gate.set()
        client.close()


# -- transfers timed by CUDA events where the data moves -------------------------------------------


class LateEvent:
    """A timing CUDA event of a GPU that finishes the transfer well after the CPU moved on.

    ``query()`` is False for 30 ms after ``record()``; elapsed times are on the GPU's own
    timeline (``GPU_MS``, advanced by the fake transfer), not the CPU's.
    """

    GPU_MS = [0.0]

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.gpu_ms = 0.0
        self.done_at = float("inf")
        self.waited_in: list[str] = []

    def record(self) -> None:
        self.gpu_ms = LateEvent.GPU_MS[0]
        self.done_at = time.monotonic() + 0.03

    def query(self) -> bool:
        return time.monotonic() >= self.done_at

    def synchronize(self) -> None:
        self.waited_in.append(threading.current_thread().name)
        time.sleep(max(0.0, self.done_at - time.monotonic()))

    def elapsed_time(self, end: LateEvent) -> float:
        assert self.query() and end.query(), "elapsed_time before both events completed"
        return end.gpu_ms - self.gpu_ms


def slow_cpu_transfer(*_: object, **__: object) -> list[object]:
    """The CPU waits 50 ms; the GPU's transfer takes 7 ms of its timeline."""
    time.sleep(0.05)
    LateEvent.GPU_MS[0] += 7.0
    return [object()]


def reported_transfers(client: PerseusClient) -> list[tuple[int, str, int, float]]:
    """The last report's transfers as the reporter thread resolves them (before encoding)."""
    rec = client.last_report
    assert rec is not None
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(rec.resolved()), name="perseus-report")
    t.start()
    t.join(5)
    [resolved] = out
    return list(resolved.transfers)  # type: ignore[attr-defined]


def events_of(client: PerseusClient) -> list[LateEvent]:
    rec = client.last_report
    assert rec is not None
    return [e for *_, ev in rec.transfers for e in ev]  # type: ignore[union-attr]


def test_torch_pipelining_p2p_ops_are_timed_by_events_resolved_off_the_training_thread(
    fake_torch, sim_gpu
):
    from perseus_client.integrations import _torch_p2p
    from perseus_client.integrations._timing import event_factory

    fake_torch.cuda.Event = LateEvent
    client = PerseusClient(offline=True, gpu=sim_gpu, handle_signals=False)
    batch = _torch_p2p._make_batch(lambda ops: [object()])
    wait = _torch_p2p._make_wait(slow_cpu_transfer)
    make_event = event_factory(None, "events")
    op = types.SimpleNamespace()
    setattr(op, _torch_p2p.TAG, (client.record_transfer, 1, "forward", 3, make_event))
    with client.iteration():
        works = batch([op])
        wait(works)
    # The training thread waited on no event; the report carries the events' 7 ms, not the
    # CPU's 50 ms wait.
    assert events_of(client) and not any(e.waited_in for e in events_of(client))
    [(boundary, direction, mb, seconds)] = reported_transfers(client)
    assert (boundary, direction, mb) == (1, "forward", 3)
    assert seconds == pytest.approx(0.007)
    assert {n for e in events_of(client) for n in e.waited_in} == {"perseus-report"}
    client.close()


def test_deepspeed_and_megatron_p2p_calls_are_timed_by_events(fake_torch, sim_gpu):
    from perseus_client.integrations.deepspeed import EngineHooks
    from perseus_client.integrations.megatron import MegatronHooks

    fake_torch.cuda.Event = LateEvent
    client = PerseusClient(offline=True, gpu=sim_gpu, handle_signals=False)
    ds = EngineHooks(object(), client, transfer_timing="events")
    ds._active = True
    send = ds._wrap_p2p(slow_cpu_transfer, 0, 0, "forward")
    mg = MegatronHooks(client, [["forward", 0, 1], ["backward", 0, 1]], transfer_timing="events")
    communicate = mg._wrap_communicate(slow_cpu_transfer)
    with client.iteration():
        send(object())
        communicate(types.SimpleNamespace(pp_group=None), recv_prev=True)  # forward 0's input
    assert not any(e.waited_in for e in events_of(client))
    assert reported_transfers(client) == [
        (0, "forward", 0, pytest.approx(0.007)),
        (0, "forward", 0, pytest.approx(0.007)),
    ]
    client.close()


def test_gloo_keeps_the_cpu_timing_and_nccl_chooses_events(fake_torch, monkeypatch):
    from perseus_client.integrations import _timing

    monkeypatch.setattr(_timing, "_backend", lambda group: "gloo")
    assert _timing.event_factory(None, "auto") is None
    monkeypatch.setattr(_timing, "_backend", lambda group: "nccl")
    fake_torch.cuda.Event = LateEvent
    make = _timing.event_factory(None, "auto")
    assert make is not None and isinstance(make(), LateEvent)
    assert _timing.event_factory(None, "cpu") is None
    with pytest.raises(ValueError, match="transfer_timing"):
        _timing.event_factory(None, "gpu")


def test_timed_call_times_on_the_cpu_or_with_a_pair_of_events() -> None:
    from perseus_client.integrations._timing import EventTiming, timed_call

    def call(x: int, *, call: str = "") -> str:  # a keyword named like timed_call's own passes
        return f"{x}{call}"

    result, seconds = timed_call(None, call, 1, call="!")
    assert result == "1!" and isinstance(seconds, float) and seconds >= 0

    log: list[str] = []

    class Event:
        def record(self) -> None:
            log.append("record")

    def traced(x: int) -> int:
        log.append("call")
        return x * 2

    result, timing = timed_call(Event, traced, 4)
    assert result == 8 and log == ["record", "call", "record"]
    assert isinstance(timing, EventTiming) and timing.start is not timing.end

    def fails() -> None:
        raise OSError("the transfer failed")

    with pytest.raises(OSError, match="the transfer failed"):
        timed_call(None, fails)
