"""A fake GPU in Zeus's own GPU slot, and no-op CUDA calls, for Zeus's real client on CPU.

Zeus's ``PipelineFrequencyOptimizer`` asks ``zeus.device.get_gpus()`` for the GPU's clocks and its
``FrequencyController`` (a forked process) locks them; both take the object in
``zeus.device.gpu._gpus`` when it is set. :func:`install` puts a :class:`FakeGPUs` there that
records every clock call as a line of JSON in a file (appended per call, so the forked controller's
calls land in it too), and makes the CUDA calls the client makes (``torch.cuda.set_device``,
``torch.cuda.synchronize``, and the availability check before them) no-ops. Nothing of the
client itself is changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zeus.device.gpu.common import GPU, GPUs, ZeusGPUNotSupportedError

__all__ = ["FakeGPU", "FakeGPUs", "install", "read_calls"]

#: The memory clocks the fake GPU offers (MHz; an A100's).
MEMORY_CLOCKS = (1593, 1215)


class FakeGPU(GPU):
    """One GPU with the given graphics clocks; every setter is recorded in ``log``."""

    def __init__(self, index: int, clocks: Sequence[int], log: Path) -> None:
        super().__init__(index)
        self.clocks = list(clocks)
        self.log = log
        self._disable_sys_admin_warning = True

    def _record(self, call: str, *args: Any) -> None:
        line = json.dumps({"pid": os.getpid(), "call": call, "args": list(args)}) + "\n"
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    @property
    def supports_nonblocking_setters(self) -> bool:
        return False

    def get_name(self) -> str:
        return "Fake A100"

    def get_supported_memory_clocks(self) -> list[int]:
        return list(MEMORY_CLOCKS)

    def get_supported_graphics_clocks(self, memory_clock_mhz: int | None = None) -> list[int]:
        return list(self.clocks)

    def set_memory_locked_clocks(
        self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        self._record("set_memory_locked_clocks", min_clock_mhz, max_clock_mhz)

    def reset_memory_locked_clocks(self, block: bool = True) -> None:
        self._record("reset_memory_locked_clocks")

    def set_gpu_locked_clocks(
        self, min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        self._record("set_gpu_locked_clocks", min_clock_mhz, max_clock_mhz)

    def reset_gpu_locked_clocks(self, block: bool = True) -> None:
        self._record("reset_gpu_locked_clocks")

    def reset_power_management_limit(self, block: bool = True) -> None:
        self._record("reset_power_management_limit")

    def get_power_management_limit_constraints(self) -> tuple[int, int]:
        return (100_000, 400_000)

    def get_power_management_limit(self) -> int:
        return 400_000

    def set_power_management_limit(self, power_limit_mw: int, block: bool = True) -> None:
        self._record("set_power_management_limit", power_limit_mw)

    def get_persistence_mode(self) -> bool:
        return True

    def set_persistence_mode(self, enabled: bool, block: bool = True) -> None:
        self._record("set_persistence_mode", enabled)

    def _unsupported(self) -> Any:
        raise ZeusGPUNotSupportedError("the fake GPU measures nothing")

    def get_average_power_usage(self) -> int:
        return int(self._unsupported())

    def get_instant_power_usage(self) -> int:
        return int(self._unsupported())

    def get_average_memory_power_usage(self) -> int:
        return int(self._unsupported())

    def supports_get_total_energy_consumption(self) -> bool:
        return False

    def get_total_energy_consumption(self) -> int:
        return int(self._unsupported())

    def get_gpu_temperature(self) -> int:
        return int(self._unsupported())


class FakeGPUs(GPUs):
    """Zeus's GPU collection holding one :class:`FakeGPU` (index 0)."""

    def __init__(
        self,
        ensure_homogeneous: bool = False,
        *,
        clocks: Sequence[int] = (),
        log: Path | None = None,
    ) -> None:
        assert log is not None
        self._gpus = [FakeGPU(0, clocks, log)]

    def __del__(self) -> None:
        pass

    @property
    def gpus(self) -> Sequence[GPU]:
        return self._gpus


def install(clocks: Sequence[int], log: Path) -> FakeGPUs:
    """Put a :class:`FakeGPUs` in Zeus's GPU slot and make the client's CUDA calls no-ops."""
    import torch
    import zeus.device.gpu as zeus_gpu

    fake = FakeGPUs(clocks=clocks, log=log)
    zeus_gpu._gpus = fake
    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None
    # zeus.utils.framework.sync_execution checks that torch has CUDA before synchronizing.
    torch.cuda.is_available = lambda: True
    return fake


def read_calls(log: Path) -> list[dict[str, Any]]:
    """The recorded calls, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]
