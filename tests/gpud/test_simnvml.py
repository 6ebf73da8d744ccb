"""The NVML stand-in enforces NVML's rules and keeps its state across processes."""

from __future__ import annotations

import csv
from pathlib import Path

import pynvml
import pytest

from perseus_client import NvmlGpu
from perseus_client.errors import GpuPermissionError
from perseus_client.gpu.nvml import reason_names
from perseus_gpud.simnvml import A100_CLOCKS_MHZ, SimulatedNvml

PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"


def test_clocks_are_the_shipped_a100_profiles() -> None:
    with PROFILE.open() as f:
        freqs = {int(row["frequency"]) for row in csv.DictReader(f)}
    assert A100_CLOCKS_MHZ == tuple(sorted(freqs, reverse=True))


def test_nvml_rules() -> None:
    nvml = SimulatedNvml(2)
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlDeviceGetCount()
    assert info.value.value == pynvml.NVML_ERROR_UNINITIALIZED
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 2
    with pytest.raises(pynvml.NVMLError) as info:
        nvml.nvmlDeviceGetHandleByIndex(2)
    assert info.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    for lo, hi in ((1200, 1005), (1500, 1500), (100, 900)):
        with pytest.raises(pynvml.NVMLError) as info:
            nvml.nvmlDeviceSetGpuLockedClocks(h, lo, hi)
        assert info.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    nvml.nvmlDeviceSetGpuLockedClocks(h, 1005, 1005)
    assert nvml.locked_clock(1) == 1005 and nvml.locked_clock(0) is None
    assert nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1005
    e0 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) >= e0


def test_clock_changes_need_root(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = SimulatedNvml(1)
    gpu = NvmlGpu(0, nvml=nvml)  # reading needs no privilege
    assert gpu.supported_clocks() == A100_CLOCKS_MHZ
    monkeypatch.setattr("os.geteuid", lambda: 65534)
    with pytest.raises(GpuPermissionError, match="CAP_SYS_ADMIN"):
        gpu.set_locked_clocks(1200)
    with pytest.raises(GpuPermissionError):
        gpu.reset_locked_clocks()


def test_state_survives_a_new_process_and_throttle_is_injected(tmp_path: Path) -> None:
    state, throttle = tmp_path / "state.json", tmp_path / "throttle.json"
    first = SimulatedNvml(2, state_path=state)
    first.nvmlInit()
    first.nvmlDeviceSetGpuLockedClocks(first.nvmlDeviceGetHandleByIndex(1), 1200, 1200)
    again = SimulatedNvml(2, state_path=state, throttle_path=throttle)
    assert again.locked_clock(1) == 1200
    again.nvmlInit()
    gpu = NvmlGpu(1, nvml=again)
    assert gpu.current_sm_clock() == 1200 and gpu.clock_event_reasons() == 0
    throttle.write_text('{"1": {"cap_mhz": 900, "reasons": ["sw_power_cap", "hw_slowdown"]}}')
    assert gpu.current_sm_clock() == 900
    assert reason_names(gpu.clock_event_reasons()) == ("sw_power_cap", "hw_slowdown")
    assert reason_names(0x1 | 0x400) == ("gpu_idle", "0x400")
