"""A rank's power floors: played on its GPU, through NVML power smoothing or the simulated model.

The NVML path runs against the repository's simulated NVML with nvidia-ml-py's power-smoothing
functions and structs (``SimulatedNvml(smoothing=True)``; it keeps what a driver would be told:
the floor as a percentage of the power limit, the ramp rates the plan's ramp bound gives, the
preset profile activated, the feature enabled and, on close, disabled). The simulated GPU's energy counter includes what a floor lifts. A GPU that
cannot hold a floor says so, with the swing the plan alone achieves.
"""

from __future__ import annotations

import time

import pynvml
import pytest

from perseus_client import FailOpenGpu, NvmlGpu, PerseusClient, SimulatedGpu
from perseus_client.errors import ClockControlUnavailableError
from perseus_client.gpu.floors import floor_changes
from perseus_client.gpu.recording import RecordingGpu
from perseus_common.wire.values import PlanStep, PlanUpdate
from perseus_gpud.simnvml import SimulatedNvml

PROFILE = {(0, "forward"): {1410: (0.02, 6.0)}, (0, "backward"): {1410: (0.04, 12.0)}}
BLOCKING = 80.0


FLOOR = pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR
UP = pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE
DOWN = pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE


def SmoothingNvml(count: int) -> SimulatedNvml:  # noqa: N802 - reads as the class it makes
    """The simulated NVML with nvidia-ml-py's power-smoothing API (``perseus_gpud.simnvml``)."""
    return SimulatedNvml(count, smoothing=True)


def test_floor_changes_merge_overlaps_and_drop_bad_floors() -> None:
    floors = [(0.5, 0.8, 200.0), (0.0, 0.2, 150.0), (0.1, 0.3, 180.0), (0.9, 0.9, 100.0),
              (1.0, 1.2, float("nan")), (1.0, 1.1, -5.0)]  # fmt: skip
    assert floor_changes(floors) == [
        (0.0, 150.0), (0.1, 180.0), (0.3, 0.0), (0.5, 200.0), (0.8, 0.0)
    ]  # fmt: skip
    assert floor_changes([]) == []


def test_nvml_holds_a_floor_through_power_smoothing() -> None:
    nvml = SmoothingNvml(1)
    gpu = NvmlGpu(0, nvml=nvml)
    assert gpu.floor_unavailable() is None
    assert gpu.set_power_floor(100.0) is True  # 100 W of the simulated A100's 400 W limit
    sm = nvml.smoothing(0)
    assert sm["params"][(0, FLOOR)] == pytest.approx(25.0)
    assert sm["active"] == 0 and sm["enabled"] and sm["floor_w"] == pytest.approx(100.0)
    assert (0, UP) not in sm["params"]  # no ramp bound: the profile's own rates
    assert gpu.set_power_floor(300.0) is True
    assert nvml.smoothing(0)["params"][(0, FLOOR)] == pytest.approx(75.0)
    gpu.close()  # releases the floor and disables the feature it enabled
    sm = nvml.smoothing(0)
    assert sm["params"][(0, FLOOR)] == 0.0 and not sm["enabled"]


def test_power_smoothing_sends_the_ramp_rates_when_they_change() -> None:
    nvml = SmoothingNvml(1)
    gpu = NvmlGpu(0, nvml=nvml)
    try:
        assert gpu.set_power_floor(0.0, 1500.0)
        assert not nvml.smoothing(0)["enabled"]  # no floor asked: nothing enabled
        assert gpu.set_power_floor(120.0, 1500.0)
        assert nvml.smoothing(0)["params"][(0, UP)] == 1500.0
        assert nvml.smoothing(0)["params"][(0, DOWN)] == 1500.0
        assert gpu.set_power_floor(150.0, 900.0)  # a new plan's ramp bound
        assert nvml.smoothing(0)["params"][(0, DOWN)] == 900.0
    finally:
        gpu.close()


def test_the_client_sends_the_plan_ramp_rate_to_nvml() -> None:
    nvml = SmoothingNvml(1)
    gpu = NvmlGpu(0, nvml=nvml)
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    try:
        steps = (PlanStep("forward", 0, 1410, 0), PlanStep("backward", 0, 1410, 0))
        client.use_plan(
            PlanUpdate(1, steps, "test", 0.06, None, ((0.0, 0.05, 250.0),), 0.65, 640.0)
        )
        with client.iteration():
            for kind in ("forward", "backward"):
                with client.instruction(kind, 0):
                    time.sleep(0.03)
        sm = nvml.smoothing(0)
        assert sm["params"][(0, UP)] == sm["params"][(0, DOWN)] == 640.0
        assert client.floor_status == "holding 1 power floor(s) per iteration"
    finally:
        client.close()


def test_an_nvml_without_power_smoothing_cannot_hold_a_floor() -> None:
    gpu = NvmlGpu(0, nvml=SimulatedNvml(1))
    assert "power smoothing" in (gpu.floor_unavailable() or "")
    assert gpu.set_power_floor(100.0) is False
    gpu.close()
    dry = NvmlGpu(0, nvml=SmoothingNvml(1), dry_run=True)
    assert "dry run" in (dry.floor_unavailable() or "") and dry.set_power_floor(50.0) is False
    dry.close()


def _plan(floors: tuple[tuple[float, float, float], ...]) -> PlanUpdate:
    steps = (PlanStep("forward", 0, 1410, 0), PlanStep("backward", 0, 1410, 0))
    return PlanUpdate(1, steps, "test", 0.06, None, floors, 0.65)


def test_the_client_plays_the_plan_floors_every_iteration() -> None:
    gpu = SimulatedGpu(PROFILE, blocking_power=BLOCKING, time_scale=1.0)
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    try:
        client.use_plan(_plan(((0.0, 0.2, 250.0),)))
        with client.iteration():
            with client.instruction("forward", 0):
                pass
            time.sleep(0.1)  # waiting at the floor
            assert gpu.power_floor == 250.0
            with client.instruction("backward", 0):
                pass
            time.sleep(0.15)  # past 0.2 s: the floor is released
            assert gpu.power_floor == 0.0
        assert client.floor_status == "holding 1 power floor(s) per iteration"
        report = client.last_report
        assert report is not None
        # 18 J of instructions, the rest waiting: 250 W for about 0.14 s, 80 W after.
        assert report.energy > 18.0 + BLOCKING * (report.iteration_time - 0.06) + 20.0
    finally:
        client.close()


def test_a_gpu_that_cannot_hold_a_floor_says_what_the_plan_alone_swings() -> None:
    gpu = SimulatedGpu(PROFILE, blocking_power=BLOCKING, time_scale=0)
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    try:
        client.use_plan(_plan(((0.0, 0.2, 250.0),)))
        with client.iteration():
            for kind in ("forward", "backward"):
                with client.instruction(kind, 0):
                    pass
        status = client.floor_status or ""
        assert "cannot hold a power floor" in status and "swings 0.65" in status
    finally:
        client.close()


def test_the_default_wrappers_pass_floors_to_the_gpu_behind_them() -> None:
    """The fail-open and recording wrappers the client builds by default forward floors."""
    nvml = SmoothingNvml(1)
    wrapped = RecordingGpu(FailOpenGpu(lambda: NvmlGpu(0, nvml=nvml)))
    try:
        assert wrapped.floor_unavailable() is None
        assert wrapped.set_power_floor(200.0, 700.0) is True
        assert nvml.smoothing(0)["floor_w"] == pytest.approx(200.0)
    finally:
        wrapped.close()
    down = FailOpenGpu(_unavailable, retry_initial=60.0, retry_max=60.0)
    try:
        assert "clock control is unavailable" in (down.floor_unavailable() or "")
        assert down.set_power_floor(200.0) is False
    finally:
        down.close()


def _unavailable() -> NvmlGpu:
    raise ClockControlUnavailableError("no NVML here")
