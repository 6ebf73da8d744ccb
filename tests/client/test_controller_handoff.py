"""The controller's hand-off: wakes only a sleeping thread, never loses one, skips stale locks."""

from __future__ import annotations

import threading

from perseus_client import FrequencyController, RecordingGpu


class Event:
    """Stands in for a CUDA event: completes when the test says so; ``query`` like CUDA's."""

    def __init__(self, done: bool = False) -> None:
        self.done = threading.Event()
        if done:
            self.done.set()
        self.waiting = threading.Event()

    def synchronize(self) -> None:
        self.waiting.set()
        self.done.wait(5)

    def query(self) -> bool:
        return self.done.is_set()


def wait_applied(ctl: FrequencyController, seq: int) -> None:
    for _ in range(1000):
        if ctl.applied_seq >= seq:
            return
        threading.Event().wait(0.005)


def test_no_request_is_lost_between_the_threads_sleeps(sim_gpu):
    # Requests spaced so that the thread sleeps between some and is busy at others: each one is
    # applied by the thread alone (no flush), the last one last.
    gpu = RecordingGpu(sim_gpu)
    ctl = FrequencyController(gpu)
    clocks = (1410, 1200, 1000)
    seq = 0
    for i in range(300):
        seq = ctl.request(clocks[i % 3])
        if i % 7 == 0:
            wait_applied(ctl, seq)
        if i % 11 == 0:
            threading.Event().wait(0.001)  # the thread goes back to sleep
    wait_applied(ctl, seq)
    assert ctl.applied_seq == seq
    assert sim_gpu.locked_clock == clocks[299 % 3]
    assert [r.mhz for r in gpu.requests] == [clocks[i % 3] for i in range(300)]  # in order
    ctl.close()


def test_a_lock_whose_instruction_has_ended_is_skipped(sim_gpu):
    gpu = RecordingGpu(sim_gpu)
    ctl = FrequencyController(gpu)
    first = Event()
    ctl.request(1200, after=first)
    assert first.waiting.wait(5)  # the thread holds the 1200 request, waiting on its event
    ctl.request(1000, after=Event(done=True))  # 1200's instruction has ended
    seq = ctl.request(1410, after=Event(done=True))  # and so has 1000's: 1000 is stale
    first.done.set()
    wait_applied(ctl, seq)
    assert [r.mhz for r in gpu.requests] == [1200, 1410]
    assert sim_gpu.locked_clock == 1410 and ctl.applied_seq == seq
    ctl.close()


def test_locks_whose_instructions_still_run_are_all_applied(sim_gpu):
    gpu = RecordingGpu(sim_gpu)
    ctl = FrequencyController(gpu)
    first, second, third = Event(), Event(), Event()
    ctl.request(1200, after=first)
    assert first.waiting.wait(5)
    ctl.request(1000, after=second)  # 1200's instruction still runs: 1000 is not stale
    seq = ctl.request(1410, after=third)
    for ev in (first, second, third):  # each completes only once the thread waits on it
        assert ev.waiting.wait(5)
        ev.done.set()
    wait_applied(ctl, seq)
    assert [r.mhz for r in gpu.requests] == [1200, 1000, 1410]
    ctl.close()
