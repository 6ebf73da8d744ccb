"""Applied-clock verification on the client.

The one-step off-plan rule, the tally, the sampler thread (off the training thread),
SimulatedGpu.throttle and NvmlGpu's read-only sampling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from client_data import PROFILE, steps_plan

from perseus_client import (
    FrequencyController,
    NvmlGpu,
    PerseusClient,
    RecordingGpu,
    Reporting,
    SimulatedGpu,
)
from perseus_client.errors import ConfigError
from perseus_client.gpu.applied import (
    AppliedClockTally,
    ClockSampler,
    LockState,
    OffPlanInstruction,
    fixed_lock,
    is_off_plan,
    steps_below,
)

CLOCKS = sorted((1410, 1395, 1380, 1365, 1200, 1005))


@pytest.mark.parametrize(
    ("locked", "sampled", "steps", "off"),
    [
        (1410, 1410, 0, False),
        (1410, 1395, 1, False),  # one step below: within the tolerance
        (1410, 1380, 2, True),
        (1410, 1404, 0, False),  # nearest supported clock is the lock itself
        (1410, 1388, 1, False),  # nearest is 1395
        (1410, 1386, 2, True),  # nearest is 1380
        (1200, 1410, 0, False),  # above the lock: never off-plan
        (1200, 1005, 1, False),
        (1365, 1005, 2, True),
        (1410, 100, 5, True),  # below every supported clock counts as the lowest
    ],
)
def test_the_off_plan_rule_allows_one_supported_step(
    locked: int, sampled: int, steps: int, off: bool
) -> None:
    assert steps_below(CLOCKS, locked, sampled) == steps
    assert is_off_plan(CLOCKS, locked, sampled) is off


def test_the_tally_reports_each_instruction_once_with_its_lowest_clock() -> None:
    tally = AppliedClockTally(CLOCKS)
    assert tally.take().samples == 0
    fwd = ("forward", 0, None)
    assert not tally.record(fwd, 1410, 1395, ())
    assert tally.record(fwd, 1410, 1200, {"sw_power_cap"})
    assert tally.record(fwd, 1410, 1005, {"hw_thermal_slowdown"})
    assert not tally.record(fwd, 1410, 210, {"gpu_idle"})  # between kernels: skipped
    assert tally.record(("backward", 1, 3), 1410, 1380, ())
    report = tally.take()
    assert report.samples == 4 and report.reasons == ("hw_thermal_slowdown", "sw_power_cap")
    assert report.off_plan == (
        OffPlanInstruction(
            "forward", 0, None, 1410, 1005, ("hw_thermal_slowdown", "sw_power_cap"), 2
        ),
        OffPlanInstruction("backward", 1, 3, 1410, 1380, (), 1),
    )
    assert tally.take().samples == 0


def test_simulated_throttle_caps_the_applied_clock_and_the_modelled_time() -> None:
    gpu = SimulatedGpu(PROFILE, stage=0, time_scale=0.0)
    gpu.set_locked_clocks(1410)
    assert gpu.sample_applied_clock() == (1410, frozenset())
    gpu.throttle(1000, reasons=("sw_thermal_slowdown",))
    assert gpu.current_clock == 1000
    assert gpu.sample_applied_clock() == (1000, frozenset({"sw_thermal_slowdown"}))
    gpu.begin_instruction("forward", 0, 0)
    assert gpu.running_instruction() == ("forward", 0, 0)
    gpu.end_instruction()
    assert gpu.running_instruction() is None
    assert gpu.timestamp() == pytest.approx(0.015)  # the profile's time at 1000 MHz
    gpu.set_locked_clocks(1000)  # the cap does not bind: no reason reported
    assert gpu.sample_applied_clock() == (1000, frozenset())
    gpu.throttle(None)
    gpu.set_locked_clocks(1410)
    assert gpu.current_clock == 1410
    with pytest.raises(ConfigError, match="reasons"):
        gpu.throttle(1000, reasons=("too_hot",))
    with pytest.raises(ConfigError, match="max_mhz"):
        gpu.throttle(0)


def test_the_sampler_thread_finds_a_throttled_instruction_and_nothing_between_instructions() -> (
    None
):
    gpu = SimulatedGpu(PROFILE, stage=0, time_scale=1.0)
    gpu.set_locked_clocks(1410)
    sampler = ClockSampler(gpu, fixed_lock(1410), interval=0.002)
    try:
        time.sleep(0.02)
        assert sampler.take().samples == 0  # no instruction running
        gpu.begin_instruction("forward", 0, 0)
        gpu.end_instruction()  # sleeps out 10 ms at 1410 MHz
        report = sampler.take()
        assert report.samples > 0 and report.off_plan == ()
        gpu.throttle(1000, reasons=("hw_thermal_slowdown",))
        gpu.begin_instruction("backward", 2, 0)
        gpu.end_instruction()  # 30 ms at 1000 MHz
        report = sampler.take()
        [off] = report.off_plan
        assert (off.instruction, off.microbatch, off.locked_mhz, off.sampled_mhz) == (
            "backward",
            2,
            1410,
            1000,
        )
        assert off.reasons == ("hw_thermal_slowdown",) and off.samples >= 1
    finally:
        sampler.close()


def _sampling_nvml(fake_nvml: Callable[..., Any], *, legacy: bool = False) -> Any:
    nvml = fake_nvml()
    nvml.NVML_CLOCK_SM = 1
    nvml.sm = 1410
    nvml.reasons = 0
    nvml.sampled_on: set[str] = set()

    def clock_info(h: Any, kind: int) -> int:
        nvml.sampled_on.add(threading.current_thread().name)
        return int(nvml.sm)

    nvml.nvmlDeviceGetClockInfo = clock_info
    name = (
        "nvmlDeviceGetCurrentClocksThrottleReasons"
        if legacy
        else "nvmlDeviceGetCurrentClocksEventReasons"
    )
    setattr(nvml, name, lambda h: nvml.reasons)
    return nvml


@pytest.mark.parametrize("legacy", [False, True])
def test_nvml_sampling_is_read_only_and_names_the_reasons(
    fake_nvml: Callable[..., Any], legacy: bool
) -> None:
    nvml = _sampling_nvml(fake_nvml, legacy=legacy)
    gpu = NvmlGpu(0, nvml=nvml)
    nvml.sm, nvml.reasons = 1005, 0x4 | 0x40
    assert gpu.sample_applied_clock() == (1005, frozenset({"sw_power_cap", "hw_thermal_slowdown"}))
    assert gpu.requests == []
    assert NvmlGpu(0, nvml=nvml, dry_run=True).sample_applied_clock() is None  # nothing locked


def test_a_client_reports_off_plan_instructions_sampled_off_the_training_thread(
    fake_nvml: Callable[..., Any],
) -> None:
    nvml = _sampling_nvml(fake_nvml)
    gpu = NvmlGpu(0, nvml=nvml)
    client = PerseusClient(
        offline=True,
        gpu=gpu,
        handle_signals=False,
        reporting=Reporting(clock_sample_interval=0.002),
    )
    assert client.clock_sampler is not None
    client.use_plan(steps_plan(1, [("forward", 0, 1410), ("backward", 0, 1200)]))
    try:

        def run(sm: int, reasons: int) -> None:
            nvml.sm, nvml.reasons = sm, reasons
            with client.iteration():
                for kind in ("forward", "backward"):
                    with client.instruction(kind, 0):
                        deadline = time.monotonic() + 0.03
                        while time.monotonic() < deadline:
                            time.sleep(0.001)

        run(1410, 0)
        nvml.sampled_on.clear()
        run(1005, 0x20)
        report = client.last_report
        assert report is not None and report.applied_clocks is not None
        kinds = {o.instruction: o for o in report.applied_clocks.off_plan}
        assert kinds["forward"].locked_mhz == 1410 and kinds["forward"].sampled_mhz == 1005
        assert kinds["forward"].reasons == ("sw_thermal_slowdown",)
        assert report.applied_clocks.reasons == ("sw_thermal_slowdown",)
        assert nvml.sampled_on == {"perseus-clock-sampler"}  # never the training thread
    finally:
        client.close()
    assert not client.clock_sampler._thread.is_alive()


def test_no_sampler_without_sampling_or_when_disabled(fake_nvml: Callable[..., Any]) -> None:
    gpu = NvmlGpu(0, nvml=fake_nvml(), dry_run=True)
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    assert client.clock_sampler is None
    client.close()
    sim = SimulatedGpu(PROFILE, stage=0, time_scale=0.0)
    client = PerseusClient(
        offline=True, gpu=sim, handle_signals=False, reporting=Reporting(clock_sample_interval=0)
    )
    assert client.clock_sampler is None
    with client.iteration(), client.instruction("forward", 0):
        pass
    assert client.last_report is not None and client.last_report.applied_clocks is None
    client.close()


class _BlockingNvmlGpu(NvmlGpu):
    """An NvmlGpu whose lock calls take as long as the test says (NVML takes milliseconds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def set_locked_clocks(self, mhz: int) -> None:
        self.entered.set()
        assert self.gate.wait(5)
        super().set_locked_clocks(mhz)


def _wait_applied(ctl: FrequencyController, seq: int) -> None:
    deadline = time.monotonic() + 5
    while ctl.applied_seq < seq and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ctl.applied_seq >= seq


def test_no_sample_while_a_lock_change_is_in_flight_or_settling(
    fake_nvml: Callable[..., Any],
) -> None:
    nvml = _sampling_nvml(fake_nvml)
    gpu = _BlockingNvmlGpu(0, nvml=nvml)
    ctl = FrequencyController(gpu)
    sampler = ClockSampler(gpu, ctl.lock_state, interval=100.0, settle=0.3)
    try:
        _wait_applied(ctl, ctl.request(1410))
        gpu.begin_instruction("forward", 0, None)
        time.sleep(0.3)
        nvml.sm = 1410
        assert sampler.sample()  # settled, on plan
        # Lowering: the GPU already runs the new clock while NVML's call has not returned.
        gpu.gate.clear()
        gpu.entered.clear()
        seq = ctl.request(1005)
        assert gpu.entered.wait(5)
        nvml.sm = 1005
        assert not sampler.sample()
        assert ctl.lock_state().generation % 2 == 1
        gpu.gate.set()
        _wait_applied(ctl, seq)
        # Raising: right after the lock the GPU still ramps up from the old clock.
        _wait_applied(ctl, ctl.request(1410))
        assert not sampler.sample()
        assert sampler.take().off_plan == ()
        time.sleep(0.3)
        nvml.sm = 1410
        assert sampler.sample()
    finally:
        sampler.close()
        ctl.close()


def test_a_sample_is_discarded_when_the_lock_changes_while_reading() -> None:
    gpu = SimulatedGpu(PROFILE, stage=0, time_scale=0.0)
    gpu.set_locked_clocks(1410)
    states = iter([LockState(2, 1410, 0.0, None), LockState(4, 1005, 0.0, None)])
    sampler = ClockSampler(gpu, lambda: next(states), interval=100.0, settle=0.0)
    try:
        gpu.begin_instruction("forward", 0, 0)
        assert not sampler.sample()
    finally:
        sampler.close()


def test_samples_of_a_failed_iteration_do_not_leak_into_the_next_report() -> None:
    gpu = SimulatedGpu(PROFILE, stage=0, time_scale=0.0)
    client = PerseusClient(
        offline=True,
        gpu=gpu,
        handle_signals=False,
        reporting=Reporting(clock_sample_interval=100.0),
    )
    sampler = client.clock_sampler
    assert sampler is not None
    sampler.settle = 0.0
    client.use_plan(steps_plan(1, [("forward", 0, 1410)]))
    try:
        gpu.throttle(1000)
        with pytest.raises(RuntimeError), client.iteration():
            with client.instruction("forward", 0):
                assert sampler.sample()  # off-plan: 1000 MHz under a lock of 1410
            raise RuntimeError("the iteration fails")
        gpu.throttle(None)
        with client.iteration(), client.instruction("forward", 0):
            pass
        report = client.last_report
        assert report is not None and report.applied_clocks is not None
        assert report.applied_clocks.off_plan == ()
    finally:
        client.close()


class _SelfSamplingGpu(SimulatedGpu):
    """A backend that samples itself (like DaemonGpu): taking its tally drains it."""

    samples_itself = True

    def __init__(self) -> None:
        super().__init__(PROFILE, stage=0, time_scale=0.0)
        self.taken = 0

    def take_applied_clocks(self) -> Any:
        self.taken += 1
        return None


def test_deciding_on_a_sampler_does_not_drain_a_self_sampling_backend() -> None:
    gpu = _SelfSamplingGpu()
    assert ClockSampler.for_backend(gpu, fixed_lock(1410), 0.05) is None
    assert ClockSampler.for_backend(RecordingGpu(gpu), fixed_lock(1410), 0.05) is None
    assert gpu.taken == 0
    sampler = ClockSampler.for_backend(
        SimulatedGpu(PROFILE, stage=0, time_scale=0.0), fixed_lock(1410), 0.05
    )
    assert sampler is not None
    sampler.close()
