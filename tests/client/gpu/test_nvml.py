"""NvmlGpu against a fake pynvml that enforces NVML's rules."""

from __future__ import annotations

import pytest

from perseus_client import (
    GpuDriverError,
    GpuNotSupportedError,
    GpuPermissionError,
    NvmlGpu,
    UnsupportedClockError,
)


def test_supported_clocks_come_from_the_highest_memory_clock(fake_nvml):
    gpu = NvmlGpu(0, nvml=fake_nvml())
    assert gpu.supported_clocks() == (1410, 1395, 1200, 1005, 210)
    assert gpu.max_clock == 1410
    assert gpu.name == "NVIDIA A100-SXM4-80GB"


def test_lock_and_reset_call_nvml_with_min_equal_max(fake_nvml):
    nvml = fake_nvml()
    gpu = NvmlGpu(0, nvml=nvml)
    gpu.set_locked_clocks(1200)
    assert nvml.state["locked"] == (1200, 1200)
    gpu.reset_locked_clocks()
    assert nvml.state["locked"] is None
    assert gpu.requests == [("set", 1200), ("reset", None)]


def test_unsupported_clock_is_refused_before_reaching_nvml(fake_nvml):
    nvml = fake_nvml()
    gpu = NvmlGpu(0, nvml=nvml)
    with pytest.raises(UnsupportedClockError, match="frequency_mhz: 1300 MHz"):
        gpu.set_locked_clocks(1300)
    assert nvml.state["calls"] == []


def test_energy_counter_is_read_in_millijoules(fake_nvml):
    gpu = NvmlGpu(0, nvml=fake_nvml())
    a = gpu.energy_mj()
    b = gpu.energy_mj()
    assert b - a == 1234


def test_no_permission_error_says_how_to_fix_it(fake_nvml):
    gpu = NvmlGpu(0, nvml=fake_nvml(permission=False))
    with pytest.raises(GpuPermissionError, match="CAP_SYS_ADMIN") as info:
        gpu.set_locked_clocks(1200)
    assert "root" in str(info.value) and "dry_run" in str(info.value)
    with pytest.raises(GpuPermissionError):
        gpu.reset_locked_clocks()


def test_not_supported_error_mentions_volta(fake_nvml):
    gpu = NvmlGpu(0, nvml=fake_nvml(supported=False))
    with pytest.raises(GpuNotSupportedError, match="Volta"):
        gpu.set_locked_clocks(1410)


def test_no_driver_error_is_actionable(fake_nvml):
    with pytest.raises(GpuDriverError, match="driver"):
        NvmlGpu(0, nvml=fake_nvml(driver=False))


def test_missing_device_index(fake_nvml):
    with pytest.raises(GpuDriverError, match="index 3"):
        NvmlGpu(3, nvml=fake_nvml())


def test_dry_run_records_without_applying(fake_nvml):
    nvml = fake_nvml(permission=False)
    gpu = NvmlGpu(0, dry_run=True, nvml=nvml)
    gpu.set_locked_clocks(1005)
    gpu.set_locked_clocks(1410)
    gpu.reset_locked_clocks()
    assert gpu.requests == [("set", 1005), ("set", 1410), ("reset", None)]
    assert nvml.state["calls"] == []  # nothing reached the GPU
    assert gpu.energy_mj() > 0  # reading still works


def test_close_shuts_nvml_down_once(fake_nvml):
    nvml = fake_nvml()
    gpu = NvmlGpu(0, nvml=nvml)
    assert nvml.state["init"] == 1
    gpu.close()
    gpu.close()
    assert nvml.state["init"] == 0
