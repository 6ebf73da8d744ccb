"""Plain values the service takes from and gives to the ranks (the gRPC adapter's side of it).

They mirror the ``perseus.v1`` messages field for field; only
:mod:`perseus_server.grpc.codec` converts between them and protobuf, so the service never
builds or parses a wire message.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "InstructionColumns",
    "InstructionReport",
    "IterationReport",
    "OffPlanReport",
    "PlanStep",
    "PlanUpdate",
    "ProfilingTask",
    "RankRegistration",
    "RegisteredRank",
    "TransferReport",
]


@dataclass(frozen=True)
class RankRegistration:
    """A rank asking to join its job (``RegisterRankRequest``)."""

    job_id: str
    global_rank: int
    pipeline_rank: int
    data_rank: int
    tensor_rank: int = 0
    gpu_name: str = ""
    supported_clocks_mhz: tuple[int, ...] = ()
    hostname: str = ""
    max_power_limit_w: float = 0.0
    #: ``active``, ``unavailable`` or ``""`` (not said), and why unavailable.
    clock_control: str = ""
    clock_control_reason: str = ""


@dataclass(frozen=True)
class RegisteredRank:
    """The rank's identity and what it needs to know of its job (``RegisterRankResponse``)."""

    rank_id: str
    plan_version: int
    stages: int
    microbatches: int
    max_clock_mhz: int


@dataclass(frozen=True)
class PlanStep:
    """One instruction of a rank's plan and the SM clock to run it at."""

    instruction: str
    microbatch: int
    frequency_mhz: int
    stage: int


@dataclass(frozen=True)
class ProfilingTask:
    """Set while the job is profiling: the clock to measure and for how many iterations."""

    frequency_mhz: int
    warmup_iterations: int
    iterations: int


@dataclass(frozen=True, eq=False)
class PlanUpdate:
    """A plan version for one rank (``PlanUpdate``).

    Compared and hashed by identity: the service builds one per (version, pipeline plan, rank
    position) and hands the same object to every stream that needs it, so the adapter can cache
    its encoding per object.
    """

    version: int
    steps: tuple[PlanStep, ...]
    reason: str
    expected_iteration_time: float = 0.0
    profiling: ProfilingTask | None = None


@dataclass(frozen=True)
class InstructionReport:
    """One measured instruction of an iteration (``InstructionMeasurement``)."""

    instruction: str
    microbatch: int
    frequency_mhz: int
    time: float
    energy: float
    stage: int


@dataclass(frozen=True, eq=False)
class InstructionColumns(Sequence[InstructionReport]):
    """The measurements of a large report as columns: one array per field, the instruction
    names as indices into ``kinds`` (its distinct names, in first-seen order).

    A sequence of :class:`InstructionReport` (equal to the tuple of the same measurements, each
    item built on access), so code written for the tuple works unchanged; the report path reads
    the arrays instead, which keeps a report of ``n`` measurements at a few objects rather than
    ``n`` (array operations: validation and per-stage medians in ``O(n log n)`` C work).
    """

    kinds: tuple[str, ...]
    kind: npt.NDArray[np.int32]
    microbatch: npt.NDArray[np.int32]
    frequency_mhz: npt.NDArray[np.int32]
    time: npt.NDArray[np.float64]
    energy: npt.NDArray[np.float64]
    stage: npt.NDArray[np.int32]

    def __len__(self) -> int:
        return len(self.kind)

    @overload
    def __getitem__(self, j: int) -> InstructionReport: ...
    @overload
    def __getitem__(self, j: slice) -> tuple[InstructionReport, ...]: ...
    def __getitem__(self, j: int | slice) -> InstructionReport | tuple[InstructionReport, ...]:
        if isinstance(j, slice):
            return tuple(self[k] for k in range(*j.indices(len(self))))
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError(j)
        return InstructionReport(
            instruction=self.kinds[int(self.kind[j])],
            microbatch=int(self.microbatch[j]),
            frequency_mhz=int(self.frequency_mhz[j]),
            time=float(self.time[j]),
            energy=float(self.energy[j]),
            stage=int(self.stage[j]),
        )

    def __iter__(self) -> Iterator[InstructionReport]:
        kinds = self.kinds
        for k, mb, f, t, e, s in zip(
            self.kind.tolist(),
            self.microbatch.tolist(),
            self.frequency_mhz.tolist(),
            self.time.tolist(),
            self.energy.tolist(),
            self.stage.tolist(),
            strict=True,
        ):
            yield InstructionReport(kinds[k], mb, f, t, e, s)

    def names(self) -> list[str]:
        """The instruction name of each measurement."""
        kinds = self.kinds
        return [kinds[k] for k in self.kind.tolist()]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, InstructionColumns | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__: Any = None


@dataclass(frozen=True)
class TransferReport:
    """One timed P2P transfer (``TransferMeasurement``): ``microbatch``'s activations
    (``forward``, stage ``boundary`` to ``boundary + 1``) or gradients (``backward``, back)."""

    boundary: int
    direction: str
    microbatch: int
    time: float


@dataclass(frozen=True)
class OffPlanReport:
    """An instruction that ran more than one supported step below its locked clock
    (``OffPlanInstruction``; ``stage`` None: the rank's pipeline_rank)."""

    instruction: str
    microbatch: int
    stage: int | None
    locked_mhz: int
    sampled_mhz: int
    reasons: tuple[str, ...]
    samples: int


@dataclass(frozen=True)
class IterationReport:
    """One iteration a rank ran (``IterationReport``)."""

    job_id: str
    rank_id: str
    iteration: int
    iteration_time: float
    plan_version: int
    #: A tuple, or :class:`InstructionColumns` for a large report (same items either way).
    instructions: Sequence[InstructionReport] = ()
    energy: float = 0.0
    #: The rank's idempotency key (increasing; the same when re-sent); 0: none.
    sequence: int = 0
    #: Applied-clock verification: off-plan instructions, samples taken, reasons seen.
    off_plan: tuple[OffPlanReport, ...] = ()
    clock_samples: int = 0
    clock_event_reasons: tuple[str, ...] = ()
    #: The client process's incarnation (0: none); sequences are compared within one.
    incarnation: int = 0
    #: ``active``, ``unavailable`` or ``""`` (not said), and why unavailable.
    clock_control: str = ""
    clock_control_reason: str = ""
    #: The P2P transfers the rank timed in this iteration.
    transfers: tuple[TransferReport, ...] = ()
