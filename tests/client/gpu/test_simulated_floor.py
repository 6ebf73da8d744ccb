"""``perseus_client.gpu.simulated_floor``: the joules a power floor adds to a simulated GPU.

:class:`FloorModel` alone on a made-up time axis, then through a running ``SimulatedGpu``.
"""

from __future__ import annotations

import threading
import time

import pytest
from client_data import PROFILE

from perseus_client import SimulatedGpu
from perseus_client.gpu.simulated_floor import FloorModel

BLOCKING = 80.0


def test_a_floor_adds_only_what_it_lifts_above_the_gpus_own_power() -> None:
    model = FloorModel(power=80.0)
    assert model.level == 0.0 and model.joules(10.0) == 0.0  # no floor: nothing added
    model.set(1.0, 200.0, ramp_w_per_s=50.0)
    assert model.level == 200.0 and model.ramp_w_per_s == 50.0
    assert model.joules(2.0) == pytest.approx(120.0)  # 1 s lifted from 80 W to 200 W
    model.switch(2.0, 300.0)  # an instruction draws more than the floor: nothing added
    assert model.joules(3.0) == pytest.approx(120.0)
    model.switch(3.0, 150.0)
    assert model.joules(4.0) == pytest.approx(170.0)  # 50 W lifted for 1 s
    model.set(4.0, 0.0)  # released: what it added stays, nothing more is added
    assert model.level == 0.0 and model.joules(100.0) == pytest.approx(170.0)


def test_a_time_before_the_last_change_adds_nothing_negative() -> None:
    model = FloorModel(power=50.0)
    model.set(5.0, 100.0)
    assert model.joules(4.0) == 0.0


def test_the_floor_may_be_set_from_another_thread() -> None:
    model = FloorModel(power=0.0)

    def setter() -> None:
        for i in range(1000):
            model.set(float(i), 10.0)

    thread = threading.Thread(target=setter)
    thread.start()
    for i in range(1000):
        model.switch(float(i), 0.0)
    thread.join()
    assert model.level == 10.0 and model.joules(1000.0) >= 0.0


def test_the_simulated_gpu_counts_what_a_floor_lifts() -> None:
    gpu = SimulatedGpu(PROFILE, blocking_power=BLOCKING, time_scale=0.5)
    assert gpu.floor_unavailable() is None
    e0, t0 = gpu.energy_mj(), gpu.timestamp()
    assert gpu.set_power_floor(200.0)
    time.sleep(0.1)  # idle: 200 W instead of 80 W
    gpu.begin_instruction("forward", 0, 0)  # 6 J over 0.02 s = 300 W: above the floor
    gpu.end_instruction()
    assert gpu.set_power_floor(0.0)
    time.sleep(0.05)
    e1, t1 = gpu.energy_mj(), gpu.timestamp()
    busy = 0.02
    idle = (t1 - t0) - busy
    lifted = (200.0 - BLOCKING) * (t1 - t0 - 0.05 / 0.5 - busy)
    want = 6.0 + BLOCKING * idle + lifted
    assert (e1 - e0) / 1000 == pytest.approx(want, rel=0.03)
    assert SimulatedGpu(PROFILE, time_scale=0).set_power_floor(100.0) is False
