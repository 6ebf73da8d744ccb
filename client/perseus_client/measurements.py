"""What the client measures and reports: per-iteration and per-instruction records.

Times are seconds on the backend's time axis (:meth:`GpuBackend.timestamp`; simulated seconds for
:class:`~perseus_client.gpu.SimulatedGpu`), energies joules from energy-counter differences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, cast

from perseus_client.gpu.applied import AppliedClockReport

__all__ = [
    "EventTiming",
    "InstructionMeasurement",
    "IterationMeasurement",
    "TRANSFER_DIRECTIONS",
    "Transfer",
]

TRANSFER_DIRECTIONS = ("forward", "backward")
"""A transfer's direction across boundary ``b`` (between model stages ``b`` and ``b + 1``):
``forward`` carries activations from ``b`` to ``b + 1``, ``backward`` gradients back."""


class EventTiming(NamedTuple):
    """A transfer timed by two CUDA events around it, resolved off the training thread.

    See :mod:`perseus_client.integrations._timing`.
    """

    start: Any
    end: Any

    def seconds(self) -> float:
        """The events' elapsed time (waits for the end event: call it off the training thread)."""
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end)) / 1000.0


Transfer = tuple[int, str, int, float]
"""One timed P2P transfer as :meth:`PerseusClient.record_transfer` records it:
``(boundary, direction, microbatch, seconds)`` (a plain tuple: the hot path allocates nothing
else); ``seconds`` may be an :class:`EventTiming` until the record is :meth:`resolved
<IterationMeasurement.resolved>`."""


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
    #: The instruction records, or what builds them (called once, by the first reader of
    #: :attr:`instructions`: the training thread hands over its timestamps, see
    #: :mod:`perseus_client.hot_path`).
    recorded: tuple[InstructionMeasurement, ...] | Callable[[], tuple[InstructionMeasurement, ...]]
    cuda_events: tuple[tuple[Any, Any], ...] = ()
    applied_clocks: AppliedClockReport | None = None
    transfers: tuple[Transfer, ...] = ()

    @property
    def instructions(self) -> tuple[InstructionMeasurement, ...]:
        """The executed instructions with their clock, time and energy."""
        r = self.recorded
        if callable(r):
            r = r()
            object.__setattr__(self, "recorded", r)  # the same value, built once
        return r

    def resolved(self) -> IterationMeasurement:
        """Replace instruction and transfer times by CUDA-event elapsed times.

        This blocks until the events complete: the reporter thread calls it, never the
        training thread.
        """
        timed = [i for i, t in enumerate(self.transfers) if isinstance(t[3], EventTiming)]
        if not self.cuda_events and not timed:
            return self
        out = list(self.instructions)
        if self.cuda_events and len(self.cuda_events) != len(out):
            raise ValueError(
                f"cuda_events: {len(self.cuda_events)} pairs for {len(out)} instructions"
            )
        for i, (start, end) in enumerate(self.cuda_events):
            end.synchronize()
            out[i] = out[i]._replace(time=start.elapsed_time(end) / 1000.0)
        transfers = list(self.transfers)
        for i in timed:
            b, d, m, ev = transfers[i]
            transfers[i] = (b, d, m, cast(EventTiming, ev).seconds())
        return replace(self, recorded=tuple(out), cuda_events=(), transfers=tuple(transfers))
