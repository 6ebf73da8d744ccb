"""``perseus_gpud.devices``: the GPUs the daemon manages, over the device interface only.

On the simulated NVML library of ``perseus gpud --simulate`` (no GPU here): clocks and floors
through the backend, the lock record written before a lock and forgotten after a reset, a
read-only daemon only telling what it would have done.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus_client.errors import GpuError, UnsupportedClockError
from perseus_client.gpu.base import DeviceIdentity
from perseus_client.gpu.nvml import NvmlGpu
from perseus_gpud.devices import ManagedGpu, open_gpus
from perseus_gpud.lockrecord import LockRecord
from perseus_gpud.simnvml import SimulatedNvml


@pytest.fixture(autouse=True)
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated NVML lets only root change clocks, as NVML does."""
    monkeypatch.setattr("os.geteuid", lambda: 0)


def test_the_daemon_manages_a_backend_through_the_interface_only(tmp_path: Path) -> None:
    throttle = tmp_path / "throttle.json"
    throttle.write_text('{"1": {"cap_mhz": 1005, "reasons": ["hw_thermal_slowdown"]}}')
    nvml = SimulatedNvml(2, throttle_path=throttle)
    [managed] = open_gpus(nvml, [1], read_only=False)
    try:
        assert managed.uuid == managed.gpu.identity().uuid and managed.minor == 1
        assert managed.lock(1410)
        mhz, bits, names = managed.sample()
        assert (mhz, names) == (1005, ("hw_thermal_slowdown",)) and bits == 0x40
        assert managed.power_w() > 0 and managed.energy_mj() >= 0
        assert managed.reset()
    finally:
        managed.close()


class NoUuidGpu(NvmlGpu):
    """A backend that cannot tell its UUID or device node."""

    def identity(self) -> DeviceIdentity:
        return DeviceIdentity(self.index)


def test_the_daemon_refuses_a_backend_without_a_uuid() -> None:
    with pytest.raises(GpuError, match="UUID"):
        ManagedGpu(NoUuidGpu(0, nvml=SimulatedNvml(1)), read_only=True)


def test_a_lock_is_recorded_before_it_is_applied_and_forgotten_at_the_leases_end(
    tmp_path: Path,
) -> None:
    record = LockRecord(tmp_path / "state.json")
    [gpu] = open_gpus(SimulatedNvml(1), None, read_only=False, record=record)
    try:
        with pytest.raises(UnsupportedClockError, match="1411 MHz is not a supported SM clock"):
            gpu.lock(1411)
        assert record.locked() == {}  # a refused clock records nothing
        assert gpu.lock(1005) and gpu.locked_mhz == 1005
        assert record.locked() == {gpu.uuid: 1005}
        assert gpu.lock(1410)
        assert gpu.reset(forget=False) and gpu.locked_mhz is None
        assert record.locked() == {gpu.uuid: 1005}  # within a lease: kept
        assert gpu.reset()
        assert record.locked() == {}
    finally:
        gpu.close()


def test_a_read_only_daemon_tells_what_it_would_have_done(tmp_path: Path) -> None:
    record = LockRecord(tmp_path / "state.json")
    [gpu] = open_gpus(SimulatedNvml(1), None, read_only=True, record=record)
    try:
        assert not gpu.lock(1005) and gpu.locked_mhz is None
        assert not gpu.reset()
        assert gpu.would == [("set", 1005), ("reset", None)]
        assert not gpu.set_power_floor(100.0)  # never applied
        assert record.locked() == {} and not (tmp_path / "state.json").exists()
    finally:
        gpu.close()


def test_a_floor_is_bounded_recorded_and_released(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    record = LockRecord(path)
    [gpu] = open_gpus(SimulatedNvml(1, smoothing=True), None, read_only=False, record=record)
    try:
        assert gpu.floor_unavailable is None and gpu.max_power_limit_w > 0
        with pytest.raises(GpuError, match="outside 0"):
            gpu.set_power_floor(gpu.max_power_limit_w + 1)
        with pytest.raises(GpuError, match="ramp_w_per_s"):
            gpu.set_power_floor(100.0, float("nan"))
        assert gpu.set_power_floor(100.0, 50.0) and gpu.floor_w == 100.0
        assert json.loads(path.read_text())["floors"] == {gpu.uuid: 100.0}
        assert gpu.release_floor() and gpu.floor_w == 0.0
        assert record.floors() == {}
        assert not gpu.release_floor()  # none held: nothing to release
    finally:
        gpu.close()


def test_a_gpu_without_power_smoothing_says_why_and_holds_no_floor(tmp_path: Path) -> None:
    record = LockRecord(tmp_path / "state.json")
    [gpu] = open_gpus(SimulatedNvml(1), None, read_only=False, record=record)
    try:
        assert gpu.floor_unavailable  # the reason, in words
        assert not gpu.set_power_floor(100.0)
        assert record.floors() == {}
    finally:
        gpu.close()


def test_opening_a_gpu_that_is_not_there_names_it() -> None:
    with pytest.raises(GpuError):
        open_gpus(SimulatedNvml(1), [0, 3], read_only=True)
