"""Plain values of the ``perseus.v1`` messages, shared by the rank client and the server.

Each class mirrors one message field for field, with the message's field names; a nested
``ClockControl`` is flattened into ``clock_control`` (one of :data:`CLOCK_CONTROL_STATES`) and
``clock_control_reason``. Only :mod:`perseus_common.wire.codec` converts them to and from
protobuf.

Every message with message fields has its value here (``tests/common/wire/test_values_round_trip.py``
holds each to exactly its fields). A flat message (scalars and repeated scalars) needs one only
where an end holds or builds it as a value; one that only its receiver reads, field by field,
has none: the server's gRPC method reads the message (``perseus_server.grpc.methods.as_message``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CLOCK_CONTROL_STATES",
    "FinishRank",
    "FinishedRank",
    "InstructionReport",
    "IterationReport",
    "OffPlanReport",
    "PlanRequest",
    "PlanStep",
    "PlanUpdate",
    "ProfilingTask",
    "RankRegistration",
    "RegisteredRank",
    "ReportAck",
    "TransferReport",
]

#: A rank's clock control as it says it: ``""`` (not said), ``"active"``, ``"unavailable"``;
#: a decoder names a state it does not know ``"?"``.
CLOCK_CONTROL_STATES: tuple[str, ...] = ("", "active", "unavailable")


@dataclass(frozen=True)
class RankRegistration:
    """A rank asking to join its job (``RegisterRankRequest``).

    ``max_power_limit_w``: its GPU's maximum power limit (W; 0: unknown).
    """

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
class PlanRequest:
    """A rank subscribing to its plan (``WatchPlanRequest``; ``known_version`` 0: none yet)."""

    job_id: str
    rank_id: str
    known_version: int = 0


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One instruction of a rank's plan and the SM clock to run it at.

    The one plan step of every package: the server deploys these, the rank client compiles
    them (:func:`perseus_client.plan.compile_plan`).
    """

    instruction: str
    microbatch: int
    frequency_mhz: int
    stage: int = 0


@dataclass(frozen=True)
class ProfilingTask:
    """Set while the job is profiling: the clock to measure and for how many iterations."""

    frequency_mhz: int
    warmup_iterations: int
    iterations: int


@dataclass(frozen=True, eq=False)
class PlanUpdate:
    """A plan version for one rank (``PlanUpdate``).

    Compared and hashed by identity: the server builds one per (version, pipeline plan, rank
    position) and hands the same object to every stream that needs it, so its adapter can cache
    the encoding per object.
    """

    version: int
    steps: tuple[PlanStep, ...]
    reason: str = ""
    expected_iteration_time: float = 0.0
    profiling: ProfilingTask | None = None
    #: ``(start_s, end_s, watts)`` within one iteration: this rank's power floors (none
    #: without a swing bound).
    power_floors: tuple[tuple[float, float, float], ...] = ()
    #: the job's swing with the plan alone (0 when no swing bound is set).
    plan_swing: float = 0.0
    #: under a ramp bound, the rate (W/s) this rank's GPU may move its floor (0: none).
    ramp_w_per_s: float = 0.0


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
class TransferReport:
    """One timed P2P transfer (``TransferMeasurement``).

    ``microbatch``'s activations (``forward``, stage ``boundary`` to ``boundary + 1``) or
    gradients (``backward``, back).
    """

    boundary: int
    direction: str
    microbatch: int
    time: float


@dataclass(frozen=True)
class OffPlanReport:
    """An instruction during which the GPU ran below its locked clock (``OffPlanInstruction``).

    Below by more than one supported step.

    ``stage`` None: the rank's pipeline_rank; ``sampled_mhz`` the lowest clock sampled;
    ``reasons`` the clock-event reasons seen in its off-plan samples (sorted); ``samples`` their
    number.
    """

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
    #: A tuple (the server may hold a large report's as columns: the same items either way).
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
    #: ``held``, ``unavailable`` or ``""`` (no floors, or not said): the plan's power floors
    #: on the rank's GPU; why unavailable, and the job's swing with the plan alone
    #: (``PowerFloorControl``, flattened as ``ClockControl`` is).
    power_floor: str = ""
    power_floor_reason: str = ""
    power_floor_swing: float = 0.0


@dataclass(frozen=True)
class ReportAck:
    """The server's answer to a batch of reports.

    How many it acknowledged (duplicates included) and how many of them were re-sent ones it
    dropped.
    """

    accepted: int
    duplicates: int


@dataclass(frozen=True)
class FinishRank:
    """A rank saying its training ended cleanly (``FinishRankRequest``)."""

    job_id: str
    rank_id: str


@dataclass(frozen=True)
class FinishedRank:
    """The answer to :class:`FinishRank` (``FinishRankResponse``)."""

    job_finished: bool
    ranks_finished: int
    ranks_registered: int
