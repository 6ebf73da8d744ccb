"""Shared fixtures of the client tests: a fake NVML enforcing NVML's rules, small profile data."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest
from client_data import PROFILE, PROFILE_CSV, steps_plan

from perseus_client import PerseusClient, RecordingGpu, SimulatedGpu
from perseus_common.wire.values import PlanUpdate


def make_fake_nvml(
    *,
    memory_clocks: tuple[int, ...] = (1593, 810),
    graphics_clocks: tuple[int, ...] = (1410, 1395, 1200, 1005, 210),
    permission: bool = True,
    supported: bool = True,
    driver: bool = True,
    device_count: int = 1,
) -> Any:
    """A stand-in for the ``pynvml`` module that enforces NVML's rules.

    Raises the real ``pynvml.NVMLError`` codes: UNINITIALIZED before ``nvmlInit``,
    DRIVER_NOT_LOADED when ``driver`` is False, INVALID_ARGUMENT for a bad index or a locked clock
    that is not a supported value (or min > max), NO_PERMISSION for clock changes without
    ``permission``, NOT_SUPPORTED for clock changes when ``supported`` is False.
    """
    m = types.SimpleNamespace()
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_"):
            setattr(m, name, getattr(pynvml, name))
    m.NVMLError = pynvml.NVMLError
    state: dict[str, Any] = {"init": 0, "locked": None, "energy": 1_000_000, "calls": []}
    m.state = state

    def err(code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def need_init() -> None:
        if state["init"] <= 0:
            raise err(pynvml.NVML_ERROR_UNINITIALIZED)

    def handle_ok(h: Any) -> None:
        need_init()
        if not (isinstance(h, tuple) and h[0] == "gpu" and 0 <= h[1] < device_count):
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlInit() -> None:
        if not driver:
            raise err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        state["init"] += 1

    def nvmlShutdown() -> None:
        need_init()
        state["init"] -= 1

    def nvmlDeviceGetHandleByIndex(i: int) -> Any:
        need_init()
        if not 0 <= i < device_count:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ("gpu", i)

    def nvmlDeviceGetName(h: Any) -> str:
        handle_ok(h)
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetSupportedMemoryClocks(h: Any) -> list[int]:
        handle_ok(h)
        return list(memory_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(h: Any, mem: int) -> list[int]:
        handle_ok(h)
        if mem not in memory_clocks:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return list(graphics_clocks) if mem == max(memory_clocks) else list(graphics_clocks[-2:])

    def nvmlDeviceSetGpuLockedClocks(h: Any, lo: int, hi: int) -> None:
        handle_ok(h)
        state["calls"].append(("set", lo, hi))
        if not supported:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not permission:
            raise err(pynvml.NVML_ERROR_NO_PERMISSION)
        if lo > hi or lo not in graphics_clocks or hi not in graphics_clocks:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        state["locked"] = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(h: Any) -> None:
        handle_ok(h)
        state["calls"].append(("reset",))
        if not supported:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not permission:
            raise err(pynvml.NVML_ERROR_NO_PERMISSION)
        state["locked"] = None

    def nvmlDeviceGetTotalEnergyConsumption(h: Any) -> int:
        handle_ok(h)
        state["energy"] += 1234
        return state["energy"]

    for fn in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetName,
        nvmlDeviceGetSupportedMemoryClocks,
        nvmlDeviceGetSupportedGraphicsClocks,
        nvmlDeviceSetGpuLockedClocks,
        nvmlDeviceResetGpuLockedClocks,
        nvmlDeviceGetTotalEnergyConsumption,
    ):
        setattr(m, fn.__name__, fn)
    return m


@pytest.fixture
def fake_nvml() -> Callable[..., Any]:
    return make_fake_nvml


@pytest.fixture
def sim_gpu() -> Iterator[SimulatedGpu]:
    gpu = SimulatedGpu(PROFILE, stage=0, blocking_power=50.0, time_scale=0.0)
    yield gpu


@pytest.fixture
def plan_of() -> Callable[..., PlanUpdate]:
    return steps_plan


@pytest.fixture
def profile_csv(tmp_path: Any) -> Any:
    path = tmp_path / "profile.csv"
    path.write_text(PROFILE_CSV)
    return path


@pytest.fixture(scope="session")
def profile_data() -> dict[tuple[int, str], dict[int, tuple[float, float]]]:
    return PROFILE


@pytest.fixture(scope="session")
def profile_text() -> str:
    return PROFILE_CSV


@pytest.fixture
def rec(sim_gpu: SimulatedGpu) -> RecordingGpu:
    """The simulated GPU, recording every clock the client asks of it."""
    return RecordingGpu(sim_gpu)


@pytest.fixture
def client(rec: RecordingGpu) -> Iterator[PerseusClient]:
    """An offline client on ``rec`` (no server, no signal handlers)."""
    c = PerseusClient(offline=True, gpu=rec, handle_signals=False)
    yield c
    c.close()
