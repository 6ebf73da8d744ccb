"""A GPU backend that forwards to another and records each instruction's span and clock.

For the demo's timeline plot. It can also hide steps from the client's energy readings
(:meth:`TimelineGpu.unmetered`): the demo's interleaved max-clock steps are its own measuring
instrument, not training, so the client reports them with no energy reading (0 J), which the
server does not count for the job's measured power or energy saved.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from perseus_client.gpu.base import GpuBackend

__all__ = ["TimelineGpu"]


class TimelineGpu(GpuBackend):
    """Forward to ``inner`` (a simulated GPU) and record each instruction's span in :attr:`spans`.

    Per instruction: ``[kind, microbatch, stage, clock, start, end]`` (``time.perf_counter()``
    seconds).
    """

    synchronous_clocks = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.spans: list[list[Any]] = []
        self._open: list[Any] | None = None
        self._frozen_mj: int | None = None

    def supported_clocks(self) -> tuple[int, ...]:
        """The inner GPU's supported clocks (MHz)."""
        return tuple(self.inner.supported_clocks())

    def set_locked_clocks(self, mhz: int) -> None:
        """Lock the inner GPU's SM clock at ``mhz``."""
        self.inner.set_locked_clocks(mhz)

    def reset_locked_clocks(self) -> None:
        """Reset the inner GPU's locked clocks."""
        self.inner.reset_locked_clocks()

    def energy_mj(self) -> int:
        """The inner GPU's energy counter (mJ); held still inside :meth:`unmetered`."""
        if self._frozen_mj is not None:
            return self._frozen_mj
        return int(self.inner.energy_mj())

    @contextmanager
    def unmetered(self) -> Iterator[None]:
        """Hold :meth:`energy_mj` at its current value meanwhile (the inner counter runs on).

        An iteration inside reads no energy, so the client reports it as not measured (0 J);
        after it the counter reads the inner GPU's again (read ``inner`` for the true energy).
        """
        self._frozen_mj = int(self.inner.energy_mj())
        try:
            yield
        finally:
            self._frozen_mj = None

    def timestamp(self) -> float:
        """The inner GPU's clock (s)."""
        return float(self.inner.timestamp())

    def begin_instruction(self, kind: str, microbatch: int, stage: int | None) -> None:
        """Start an instruction on the inner GPU and open its span at the current clock."""
        self.inner.begin_instruction(kind, microbatch, stage)
        self._open = [kind, microbatch, stage, self.inner.current_clock, time.perf_counter()]

    def end_instruction(self) -> None:
        """End the instruction on the inner GPU and record its span."""
        self.inner.end_instruction()
        if self._open is not None:
            self.spans.append([*self._open, time.perf_counter()])
            self._open = None

    def abort_instruction(self) -> None:
        """Abort the instruction on the inner GPU; its span is dropped."""
        self.inner.abort_instruction()
        self._open = None
