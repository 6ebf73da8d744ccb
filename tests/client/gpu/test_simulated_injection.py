"""``perseus_client.gpu.simulated_injection``: a straggler's time factor and slow links.

What tests and demos inject into a simulated GPU, at construction or mid-run; ``slowdown`` (a
factor) still works and warns.
"""

from __future__ import annotations

import pytest
from client_data import PROFILE

from perseus_client import ConfigError, SimulatedGpu


def run(gpu, kind="forward", stage=None):
    gpu.begin_instruction(kind, 0, stage)
    gpu.end_instruction()


def test_time_factor_is_the_factor_and_slowdown_its_deprecated_name(profile_data):
    gpu = SimulatedGpu(profile_data, stage=0, time_scale=0, time_factor=1.5)
    assert gpu.time_factor == 1.5
    t0 = gpu.timestamp()
    run(gpu)
    assert gpu.timestamp() - t0 == pytest.approx(0.015)
    with pytest.raises(ConfigError, match="time_factor"):
        gpu.set_time_factor(float("nan"))
    with pytest.warns(DeprecationWarning, match="time_factor"):
        gpu.set_slowdown(2.0)
    assert gpu.time_factor == 2.0
    with pytest.warns(DeprecationWarning):
        old = SimulatedGpu(profile_data, stage=0, time_scale=0, slowdown=1.2)
    assert old.time_factor == 1.2


def test_a_simulated_gpu_injects_a_links_latency_and_it_can_slow_mid_run():
    gpu = SimulatedGpu(
        PROFILE, stage=0, time_scale=0, blocking_power=50.0, transfer_times={(0, "forward"): 0.002}
    )
    t0 = gpu.timestamp()
    assert gpu.transfer(0, "forward") == 0.002 and gpu.timestamp() - t0 == pytest.approx(0.002)
    assert gpu.transfer(0, "backward") == 0.0  # no latency injected there
    gpu.set_transfer_time(0, "forward", 0.008)  # the link slows down
    assert gpu.transfer_time(0, "forward") == 0.008
    t1 = gpu.timestamp()
    gpu.transfer(0, "forward")
    assert gpu.timestamp() - t1 == pytest.approx(0.008)
    with pytest.raises(ConfigError):
        gpu.set_transfer_time(0, "sideways", 0.001)
    with pytest.raises(ConfigError):
        gpu.set_transfer_time(0, "forward", -1.0)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, "forward", 0.001), "boundary"),
        ((0, "sideways", 0.001), "direction"),
        ((0, "forward", float("inf")), "transfer_time"),
    ],
)
def test_a_bad_link_latency_names_its_field(args: tuple[int, str, float], field: str) -> None:
    gpu = SimulatedGpu(PROFILE, stage=0, time_scale=0)
    with pytest.raises(ConfigError) as info:
        gpu.set_transfer_time(*args)
    assert info.value.field == field
    assert gpu.transfer_time(0, "forward") == 0.0  # nothing injected


def test_a_scaled_transfer_sleeps_its_scaled_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import perseus_client.gpu.simulated_injection as injection

    sleeps: list[float] = []
    monkeypatch.setattr(injection.time, "sleep", sleeps.append)
    gpu = SimulatedGpu(PROFILE, stage=0, time_scale=0.5, transfer_times={(1, "backward"): 0.004})
    t0 = gpu.timestamp()
    assert gpu.transfer(1, "backward") == 0.004
    assert sleeps == [pytest.approx(0.002)]  # half the simulated seconds, in wall time
    assert gpu.timestamp() - t0 >= 0.004  # the simulated clock moved by the whole latency
