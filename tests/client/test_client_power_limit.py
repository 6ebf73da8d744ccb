"""Every GPU backend tells the GPU's maximum power limit, which the client registers.

The limit is the cost policy's MAXPOWER, registered with the server: NVML's power-limit constraints,
the simulated GPU's argument or the known-GPU table, forwarded by the recording backend.
"""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from perseus_client import ConfigError, NvmlGpu, RecordingGpu, SimulatedGpu
from perseus_gpud.simnvml import SimulatedNvml

PROFILE = {(0, "forward"): {1410: (0.01, 3.0), 1005: (0.015, 2.4)}}


def test_nvml_reads_the_max_of_the_power_limit_constraints() -> None:
    gpu = NvmlGpu(0, nvml=SimulatedNvml(1))
    try:
        assert gpu.max_power_limit_w() == 400.0  # the simulated A100 SXM's 100-400 W
    finally:
        gpu.close()


class _NoPowerManagement(SimulatedNvml):
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> tuple[int, int]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_nvml_without_power_management_cannot_tell() -> None:
    gpu = NvmlGpu(0, nvml=_NoPowerManagement(1))
    try:
        assert gpu.max_power_limit_w() is None
    finally:
        gpu.close()


def test_simulated_gpu_takes_it_as_an_argument_or_from_the_known_gpus() -> None:
    assert SimulatedGpu(PROFILE, time_scale=0).max_power_limit_w() is None
    assert SimulatedGpu(PROFILE, time_scale=0, name="NVIDIA A40").max_power_limit_w() == 300.0
    assert SimulatedGpu(PROFILE, time_scale=0, name="A100").max_power_limit_w() == 400.0
    gpu = SimulatedGpu(PROFILE, time_scale=0, name="A100", max_power_limit_w=250.0)
    assert gpu.max_power_limit_w() == 250.0
    assert RecordingGpu(gpu).max_power_limit_w() == 250.0
    with pytest.raises(ConfigError, match="max_power_limit_w"):
        SimulatedGpu(PROFILE, time_scale=0, max_power_limit_w=-1.0)
