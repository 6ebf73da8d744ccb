"""What the client measures and reports: per-iteration and per-instruction records.

Times are seconds on the backend's time axis (:meth:`GpuBackend.timestamp`; simulated seconds for
:class:`~perseus_client.gpu.SimulatedGpu`), energies joules from energy-counter differences.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from perseus_client.gpu.applied import AppliedClockReport

__all__ = ["InstructionMeasurement", "IterationMeasurement", "TRANSFER_DIRECTIONS", "Transfer"]

TRANSFER_DIRECTIONS = ("forward", "backward")
"""A transfer's direction across boundary ``b`` (between model stages ``b`` and ``b + 1``):
``forward`` carries activations from ``b`` to ``b + 1``, ``backward`` gradients back."""

Transfer = tuple[int, str, int, float]
"""One timed P2P transfer as :meth:`PerseusClient.record_transfer` records it:
``(boundary, direction, microbatch, seconds)`` (a plain tuple: the hot path allocates nothing
else)."""


class InstructionMeasurement(NamedTuple):
    """One executed instruction: its clock, duration and (when measured) energy (0: not measured)."""

    kind: str
    microbatch: int
    stage: int
    frequency_mhz: int
    time: float
    energy: float


@dataclass(frozen=True)
class IterationMeasurement:
    """One iteration as reported to the server over ``ReportIterations``.

    ``cuda_events`` holds ``(start, end)`` CUDA event pairs whose elapsed time replaces the
    instructions' times when the report is sent (resolved off the training thread).
    ``applied_clocks`` is what the applied-clock samples showed during the iteration (``None``:
    nobody sampled; see :mod:`perseus_client.gpu.applied`). ``transfers`` are the P2P transfers
    timed during it (:data:`Transfer` tuples, as recorded; checked when the report is built).
    """

    iteration: int
    iteration_time: float
    plan_version: int
    energy: float
    instructions: tuple[InstructionMeasurement, ...]
    cuda_events: tuple[tuple[Any, Any], ...] = ()
    applied_clocks: AppliedClockReport | None = None
    transfers: tuple[Transfer, ...] = ()

    def resolved(self) -> IterationMeasurement:
        """Replace instruction times by CUDA-event elapsed times (blocks until they complete)."""
        if not self.cuda_events:
            return self
        out = []
        for m, (start, end) in zip(self.instructions, self.cuda_events, strict=True):
            end.synchronize()
            out.append(m._replace(time=start.elapsed_time(end) / 1000.0))
        return replace(self, instructions=tuple(out), cuda_events=())
