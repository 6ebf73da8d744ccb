"""SimulatedGpu: the DVFS model, the energy counter, slowdown, state file.

Its profile reading is ``test_curves.py``'s, its injections ``test_simulated_injection.py``'s, its
floor ``test_simulated_floor.py``'s; the wrapper that records it ``test_recording.py``'s.
"""

from __future__ import annotations

import sys
import time

import pytest

from perseus_client import (
    ConfigError,
    SimulatedGpu,
    UnsupportedClockError,
    read_profile_csv,
)


def run(gpu, kind="forward", stage=None):
    gpu.begin_instruction(kind, 0, stage)
    gpu.end_instruction()


def test_instruction_takes_the_profile_time_and_energy_at_the_locked_clock(sim_gpu):
    sim_gpu.set_locked_clocks(1200)
    t0, e0 = sim_gpu.timestamp(), sim_gpu.energy_mj()
    run(sim_gpu, "backward")
    assert sim_gpu.timestamp() - t0 == pytest.approx(0.024)
    assert sim_gpu.energy_mj() - e0 == 5200


def test_unlocked_gpu_runs_at_the_maximum_clock(sim_gpu):
    t0 = sim_gpu.timestamp()
    run(sim_gpu)
    assert sim_gpu.timestamp() - t0 == pytest.approx(0.010)
    assert sim_gpu.current_clock == 1410


def test_clocks_between_profiled_points_interpolate(profile_data):
    gpu = SimulatedGpu(profile_data, stage=0, time_scale=0, supported_clocks=[1410, 1305, 1200])
    gpu.set_locked_clocks(1305)
    t, e = gpu.instruction_cost("forward")
    assert t == pytest.approx(0.011) and e == pytest.approx(2.8)


def test_other_stage_data_and_missing_data(profile_data):
    gpu = SimulatedGpu(profile_data, stage=0, time_scale=0)
    assert gpu.instruction_cost("forward", stage=1) == (0.011, 3.3)
    with pytest.raises(ConfigError, match="stage 0 'backward_input'"):
        gpu.begin_instruction("backward_input", 0, None)


def test_unsupported_clock(sim_gpu):
    with pytest.raises(UnsupportedClockError, match="1300"):
        sim_gpu.set_locked_clocks(1300)


def test_slowdown_scales_time_and_energy(sim_gpu):
    sim_gpu.set_slowdown(1.5)
    t0, e0 = sim_gpu.timestamp(), sim_gpu.energy_mj()
    run(sim_gpu)
    assert sim_gpu.timestamp() - t0 == pytest.approx(0.015)
    assert sim_gpu.energy_mj() - e0 == 4500
    with pytest.raises(ConfigError, match="slowdown"):
        sim_gpu.set_slowdown(0)


def test_scaled_time_sleeps_and_waiting_draws_blocking_power(profile_data):
    gpu = SimulatedGpu(profile_data, stage=0, blocking_power=100.0, time_scale=1.0)
    # Each energy reading is bracketed by two timestamps, so the check holds exactly however the
    # process is scheduled between the calls.
    w0, t0 = time.perf_counter(), gpu.timestamp()
    e0 = gpu.energy_mj()
    t0_after = gpu.timestamp()
    run(gpu)  # 10 ms at 1410 MHz, 3 J
    assert time.perf_counter() - w0 >= 0.010
    t1 = gpu.timestamp()
    e1 = gpu.energy_mj()
    t1_after = gpu.timestamp()
    assert t1 - t0 >= 0.010
    # Energy: the instruction's 3 J plus blocking power over whatever else elapsed (the counter
    # reads whole millijoules).
    joules = (e1 - e0) / 1000
    assert 3.0 + 100.0 * (t1 - t0_after - 0.010) - 0.002 <= joules
    assert joules <= 3.0 + 100.0 * (t1_after - t0 - 0.010) + 0.002
    time.sleep(0.02)
    idle_before = gpu.timestamp() - t1_after
    waited = (gpu.energy_mj() - e1) / 1000
    idle_after = gpu.timestamp() - t1
    assert idle_before >= 0.02
    assert 100.0 * idle_before - 0.002 <= waited <= 100.0 * idle_after + 0.002


def test_simulated_time_is_scaled(profile_data):
    gpu = SimulatedGpu(profile_data, stage=0, time_scale=0.5)
    w0, t0 = time.perf_counter(), gpu.timestamp()
    run(gpu, "backward")  # 20 ms simulated = 10 ms wall
    wall = time.perf_counter() - w0
    assert wall >= 0.010
    assert gpu.timestamp() - t0 == pytest.approx(0.020, abs=2 * 0.5e-3 + (wall - 0.010) * 2)


def test_state_file_persists_lock_and_reset(tmp_path, profile_data):
    path = tmp_path / "gpu.json"
    gpu = SimulatedGpu(profile_data, stage=0, time_scale=0, state_path=path)
    gpu.set_locked_clocks(1000)
    assert SimulatedGpu.read_state(path) == {"locked_clock_mhz": 1000, "sets": 1, "resets": 0}
    gpu.reset_locked_clocks()
    assert SimulatedGpu.read_state(path)["locked_clock_mhz"] is None


def test_from_profile_csv_and_text(profile_csv):
    gpu = SimulatedGpu.from_profile_csv(profile_csv, stage=1, time_scale=0)
    assert gpu.stage == 1 and gpu.stages == (1,)
    assert gpu.supported_clocks() == (1410, 1200, 1000)
    assert gpu.instruction_cost("backward") == (0.022, 6.6)
    data = read_profile_csv(profile_csv.read_text())
    assert data[(0, "forward")][1000] == (0.015, 2.4)


def test_from_a_loaded_perseus_profile(profile_csv):
    from perseus.profiles import load_profile

    gpu = SimulatedGpu.from_profile(load_profile(profile_csv), stage=0, time_scale=0)
    assert gpu.instruction_cost("forward", mhz=1200) == pytest.approx((0.012, 2.6))


def test_real_profile_file():
    gpu = SimulatedGpu.from_profile_csv(
        "profiles/gpt3-175b_a100-sxm_8stage.csv", stage=3, blocking_power=83.64, time_scale=0
    )
    assert gpu.max_clock == 1410
    t_hi, _ = gpu.instruction_cost("forward", mhz=1410)
    t_lo, _ = gpu.instruction_cost("forward", mhz=gpu.supported_clocks()[-1])
    assert t_lo > t_hi


def test_simulated_module_does_not_import_scipy_or_perseus_core():
    # The simulated backend is part of the light client (checked in a clean interpreter elsewhere).
    assert "perseus_client.gpu.simulated" in sys.modules
    import perseus_client.gpu.simulated as sim

    assert "scipy" not in sim.__dict__ and "numpy" not in sim.__dict__


def test_aborted_instruction_does_not_sleep_out_its_duration(profile_data, monkeypatch):
    import perseus_client.gpu.simulated as simulated

    sleeps: list[float] = []
    monkeypatch.setattr(simulated.time, "sleep", sleeps.append)
    gpu = SimulatedGpu(profile_data, stage=0, time_scale=100.0)  # forward = 1 s of wall time
    gpu.begin_instruction("forward", 0, None)
    gpu.abort_instruction()
    assert sleeps == []
    gpu.begin_instruction("forward", 0, None)
    gpu.end_instruction()
    assert len(sleeps) == 1 and 0 < sleeps[0] <= 1.0


def test_real_work_longer_than_the_scaled_time_is_reported_once(profile_data, caplog):
    # forward at 1410 MHz: 0.01 s modelled, x 0.05 = 0.5 ms of wall time; the work takes ~20 ms.
    gpu = SimulatedGpu(profile_data, stage=0, time_scale=0.05)
    with caplog.at_level("WARNING", logger="perseus_client.gpu"):
        for mb in range(3):
            gpu.begin_instruction("forward", mb, 0)
            time.sleep(0.02)
            gpu.end_instruction()
    assert gpu.overruns == 3
    warned = [r for r in caplog.records if "longer than its scaled time" in r.getMessage()]
    assert len(warned) == 1
    assert "forward of microbatch 0 on stage 0" in warned[0].getMessage()
    # Within the scaled time, nothing is reported.
    calm = SimulatedGpu(profile_data, stage=0, time_scale=1.0)
    calm.begin_instruction("forward", 0, 0)
    calm.end_instruction()
    assert calm.overruns == 0
