"""A GPU backend that forwards to another and records each instruction's span and clock, for
the demo's timeline plot."""

from __future__ import annotations

import time
from typing import Any

from perseus_client.gpu.base import GpuBackend

__all__ = ["TimelineGpu"]


class TimelineGpu(GpuBackend):
    """Forward to ``inner`` (a simulated GPU) and record, per instruction, ``[kind, microbatch,
    stage, clock, start, end]`` (``time.perf_counter()`` seconds) in :attr:`spans`."""

    synchronous_clocks = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.spans: list[list[Any]] = []
        self._open: list[Any] | None = None

    def supported_clocks(self) -> tuple[int, ...]:
        return tuple(self.inner.supported_clocks())

    def set_locked_clocks(self, mhz: int) -> None:
        self.inner.set_locked_clocks(mhz)

    def reset_locked_clocks(self) -> None:
        self.inner.reset_locked_clocks()

    def energy_mj(self) -> int:
        return int(self.inner.energy_mj())

    def timestamp(self) -> float:
        return float(self.inner.timestamp())

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:
        self.inner.begin_instruction(kind, microbatch, stage)
        self._open = [kind, microbatch, stage, self.inner.current_clock, time.perf_counter()]

    def end_instruction(self) -> None:
        self.inner.end_instruction()
        if self._open is not None:
            self.spans.append([*self._open, time.perf_counter()])
            self._open = None

    def abort_instruction(self) -> None:
        self.inner.abort_instruction()
        self._open = None
