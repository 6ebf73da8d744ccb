"""SimulatedGpu's seeded measurement noise."""

from __future__ import annotations

import statistics

import pytest

from perseus_client import ConfigError, SimulatedGpu

DATA = {(0, "forward"): {1410: (0.010, 2.0), 1200: (0.012, 1.8)}}


def sample(gpu: SimulatedGpu, count: int) -> tuple[list[float], list[float]]:
    times, energies = [], []
    for _ in range(count):
        t0, e0 = gpu.timestamp(), gpu.energy_mj()
        gpu.begin_instruction("forward", 0, 0)
        gpu.end_instruction()
        times.append(gpu.timestamp() - t0)
        energies.append((gpu.energy_mj() - e0) / 1000.0)
    return times, energies


def test_no_noise_is_exact() -> None:
    times, energies = sample(SimulatedGpu(DATA, time_scale=0, seed=1), 20)
    assert times == pytest.approx([0.010] * 20) and energies == pytest.approx([2.0] * 20)


def test_noise_has_the_given_relative_spread_around_the_model() -> None:
    gpu = SimulatedGpu(DATA, time_scale=0, noise=0.02, energy_noise=0.05, seed=7)
    times, energies = sample(gpu, 2000)
    assert statistics.mean(times) == pytest.approx(0.010, rel=0.003)
    assert statistics.stdev(times) / 0.010 == pytest.approx(0.02, rel=0.1)
    assert statistics.mean(energies) == pytest.approx(2.0, rel=0.008)
    assert statistics.stdev(energies) / 2.0 == pytest.approx(0.05, rel=0.1)
    assert gpu.instruction_cost("forward") == (0.010, 2.0)  # the model stays noiseless


def test_same_seed_same_draws_and_energy_noise_defaults_to_noise() -> None:
    a = sample(SimulatedGpu(DATA, time_scale=0, noise=0.01, seed=3), 50)
    b = sample(SimulatedGpu(DATA, time_scale=0, noise=0.01, seed=3), 50)
    c = sample(SimulatedGpu(DATA, time_scale=0, noise=0.01, seed=4), 50)
    assert a == b and a != c
    assert statistics.stdev(a[1]) > 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"noise": -0.1}, "noise"),
        ({"noise": 1.0}, "noise"),
        ({"energy_noise": float("nan")}, "energy_noise"),
    ],
)
def test_bad_noise_is_refused(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        SimulatedGpu(DATA, **kwargs)
