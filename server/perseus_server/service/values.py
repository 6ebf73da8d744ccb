"""Plain values the service takes from and gives to the ranks (the gRPC adapter's side of it).

They mirror the ``perseus.v1`` messages field for field; only
:mod:`perseus_server.grpc_codec` converts between them and protobuf, so the service never
builds or parses a wire message.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "InstructionReport",
    "IterationReport",
    "OffPlanReport",
    "PlanStep",
    "PlanUpdate",
    "ProfilingTask",
    "RankRegistration",
    "RegisteredRank",
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
    instructions: tuple[InstructionReport, ...] = ()
    energy: float = 0.0
    #: The rank's idempotency key (increasing; the same when re-sent); 0: none.
    sequence: int = 0
    #: Applied-clock verification: off-plan instructions, samples taken, reasons seen.
    off_plan: tuple[OffPlanReport, ...] = ()
    clock_samples: int = 0
    clock_event_reasons: tuple[str, ...] = ()
