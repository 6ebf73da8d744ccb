"""The frequency controller: off-thread, in order, no-op skipping, errors contained."""

from __future__ import annotations

import threading

from perseus_client import FrequencyController, NvmlGpu, RecordingGpu


class SlowEvent:
    """Stands in for a CUDA event: completes when the test says so."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waited_in: str | None = None

    def synchronize(self) -> None:
        self.waited_in = threading.current_thread().name
        self.done.wait(5)


def test_requests_apply_in_order_and_no_ops_are_skipped(sim_gpu):
    gpu = RecordingGpu(sim_gpu)
    ctl = FrequencyController(gpu)
    for f in (1200, 1200, 1000, 1000, 1410, 1200):
        ctl.request(f)
    ctl.flush()
    assert [r.mhz for r in gpu.requests] == [1200, 1000, 1410, 1200]
    assert sim_gpu.locked_clock == 1200
    ctl.close()
    assert gpu.requests[-1].op == "reset" and sim_gpu.locked_clock is None


def test_background_thread_applies_without_the_caller(sim_gpu):
    ctl = FrequencyController(sim_gpu)
    seq = ctl.request(1000)
    for _ in range(500):
        if ctl.applied_seq >= seq:
            break
        threading.Event().wait(0.01)
    assert sim_gpu.locked_clock == 1000
    ctl.close()


def test_a_request_without_wake_waits_for_the_callers_flush(sim_gpu):
    # What the client does for synchronous backends: no thread hand-off per instruction.
    ctl = FrequencyController(sim_gpu)
    seq = ctl.request(1000, wake=False)
    threading.Event().wait(0.1)
    assert ctl.applied_seq < seq and sim_gpu.locked_clock is None  # the thread slept on
    ctl.flush(seq)
    assert ctl.applied_seq == seq and sim_gpu.locked_clock == 1000
    ctl.close()


def test_clock_change_waits_for_the_previous_instructions_event(fake_nvml):
    nvml = fake_nvml()
    gpu = NvmlGpu(0, nvml=nvml)
    ctl = FrequencyController(gpu, thread_name="clock-test")
    ev = SlowEvent()
    seq = ctl.request(1200, after=ev)
    threading.Event().wait(0.05)
    assert nvml.state["locked"] is None  # still waiting on the event, training thread is free
    ev.done.set()
    for _ in range(500):
        if ctl.applied_seq >= seq:
            break
        threading.Event().wait(0.01)
    assert nvml.state["locked"] == (1200, 1200)
    assert ev.waited_in == "clock-test"
    ctl.close()
    assert nvml.state["locked"] is None


def test_backend_errors_never_reach_the_training_thread(fake_nvml, caplog):
    gpu = NvmlGpu(0, nvml=fake_nvml(permission=False))
    ctl = FrequencyController(gpu)
    ctl.request(1200)
    ctl.flush()
    ctl.request(1005)
    ctl.flush()
    assert "CAP_SYS_ADMIN" in str(ctl.last_error)
    assert sum("could not apply" in r.message for r in caplog.records) == 1  # logged once
    ctl.close()


def test_reset_now_drops_pending_and_blocks_later_requests(sim_gpu):
    gpu = RecordingGpu(sim_gpu)
    ctl = FrequencyController(gpu)
    ctl.request(1000)
    ctl.reset_now()
    ctl.request(1200)
    ctl.flush()
    assert sim_gpu.locked_clock is None
    assert all(r.mhz != 1200 for r in gpu.requests)
    ctl.close()
