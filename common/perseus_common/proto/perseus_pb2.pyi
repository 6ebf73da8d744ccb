from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClockControlState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLOCK_CONTROL_UNSPECIFIED: _ClassVar[ClockControlState]
    CLOCK_CONTROL_ACTIVE: _ClassVar[ClockControlState]
    CLOCK_CONTROL_UNAVAILABLE: _ClassVar[ClockControlState]

class PowerFloorState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POWER_FLOOR_UNSPECIFIED: _ClassVar[PowerFloorState]
    POWER_FLOOR_HELD: _ClassVar[PowerFloorState]
    POWER_FLOOR_UNAVAILABLE: _ClassVar[PowerFloorState]
CLOCK_CONTROL_UNSPECIFIED: ClockControlState
CLOCK_CONTROL_ACTIVE: ClockControlState
CLOCK_CONTROL_UNAVAILABLE: ClockControlState
POWER_FLOOR_UNSPECIFIED: PowerFloorState
POWER_FLOOR_HELD: PowerFloorState
POWER_FLOOR_UNAVAILABLE: PowerFloorState

class RegisterRankRequest(_message.Message):
    __slots__ = ("job_id", "global_rank", "pipeline_rank", "data_rank", "tensor_rank", "gpu_name", "supported_clocks_mhz", "hostname", "max_power_limit_w", "clock_control")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_RANK_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_RANK_FIELD_NUMBER: _ClassVar[int]
    TENSOR_RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_NAME_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_CLOCKS_MHZ_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    MAX_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    CLOCK_CONTROL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    global_rank: int
    pipeline_rank: int
    data_rank: int
    tensor_rank: int
    gpu_name: str
    supported_clocks_mhz: _containers.RepeatedScalarFieldContainer[int]
    hostname: str
    max_power_limit_w: float
    clock_control: ClockControl
    def __init__(self, job_id: _Optional[str] = ..., global_rank: _Optional[int] = ..., pipeline_rank: _Optional[int] = ..., data_rank: _Optional[int] = ..., tensor_rank: _Optional[int] = ..., gpu_name: _Optional[str] = ..., supported_clocks_mhz: _Optional[_Iterable[int]] = ..., hostname: _Optional[str] = ..., max_power_limit_w: _Optional[float] = ..., clock_control: _Optional[_Union[ClockControl, _Mapping]] = ...) -> None: ...

class ClockControl(_message.Message):
    __slots__ = ("state", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: ClockControlState
    reason: str
    def __init__(self, state: _Optional[_Union[ClockControlState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class RegisterRankResponse(_message.Message):
    __slots__ = ("rank_id", "plan_version", "stages", "microbatches", "max_clock_mhz")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    MAX_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    plan_version: int
    stages: int
    microbatches: int
    max_clock_mhz: int
    def __init__(self, rank_id: _Optional[str] = ..., plan_version: _Optional[int] = ..., stages: _Optional[int] = ..., microbatches: _Optional[int] = ..., max_clock_mhz: _Optional[int] = ...) -> None: ...

class WatchPlanRequest(_message.Message):
    __slots__ = ("job_id", "rank_id", "known_version")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank_id: str
    known_version: int
    def __init__(self, job_id: _Optional[str] = ..., rank_id: _Optional[str] = ..., known_version: _Optional[int] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("instruction", "microbatch", "frequency_mhz", "stage")
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    instruction: str
    microbatch: int
    frequency_mhz: int
    stage: int
    def __init__(self, instruction: _Optional[str] = ..., microbatch: _Optional[int] = ..., frequency_mhz: _Optional[int] = ..., stage: _Optional[int] = ...) -> None: ...

class ProfilingTask(_message.Message):
    __slots__ = ("frequency_mhz", "warmup_iterations", "iterations")
    FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    WARMUP_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    frequency_mhz: int
    warmup_iterations: int
    iterations: int
    def __init__(self, frequency_mhz: _Optional[int] = ..., warmup_iterations: _Optional[int] = ..., iterations: _Optional[int] = ...) -> None: ...

class PowerFloor(_message.Message):
    __slots__ = ("start_s", "end_s", "watts")
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    WATTS_FIELD_NUMBER: _ClassVar[int]
    start_s: float
    end_s: float
    watts: float
    def __init__(self, start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., watts: _Optional[float] = ...) -> None: ...

class PlanUpdate(_message.Message):
    __slots__ = ("version", "steps", "reason", "expected_iteration_time", "profiling", "power_floors", "plan_swing", "ramp_w_per_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ITERATION_TIME_FIELD_NUMBER: _ClassVar[int]
    PROFILING_FIELD_NUMBER: _ClassVar[int]
    POWER_FLOORS_FIELD_NUMBER: _ClassVar[int]
    PLAN_SWING_FIELD_NUMBER: _ClassVar[int]
    RAMP_W_PER_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    steps: _containers.RepeatedCompositeFieldContainer[PlanStep]
    reason: str
    expected_iteration_time: float
    profiling: ProfilingTask
    power_floors: _containers.RepeatedCompositeFieldContainer[PowerFloor]
    plan_swing: float
    ramp_w_per_s: float
    def __init__(self, version: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ..., reason: _Optional[str] = ..., expected_iteration_time: _Optional[float] = ..., profiling: _Optional[_Union[ProfilingTask, _Mapping]] = ..., power_floors: _Optional[_Iterable[_Union[PowerFloor, _Mapping]]] = ..., plan_swing: _Optional[float] = ..., ramp_w_per_s: _Optional[float] = ...) -> None: ...

class InstructionMeasurement(_message.Message):
    __slots__ = ("instruction", "microbatch", "frequency_mhz", "time", "energy", "stage")
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_MHZ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    instruction: str
    microbatch: int
    frequency_mhz: int
    time: float
    energy: float
    stage: int
    def __init__(self, instruction: _Optional[str] = ..., microbatch: _Optional[int] = ..., frequency_mhz: _Optional[int] = ..., time: _Optional[float] = ..., energy: _Optional[float] = ..., stage: _Optional[int] = ...) -> None: ...

class IterationReport(_message.Message):
    __slots__ = ("job_id", "rank_id", "iteration", "iteration_time", "plan_version", "instructions", "energy", "sequence", "off_plan", "clock_samples", "clock_event_reasons", "incarnation", "clock_control", "transfers", "power_floor")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ITERATION_TIME_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OFF_PLAN_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CLOCK_CONTROL_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    POWER_FLOOR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank_id: str
    iteration: int
    iteration_time: float
    plan_version: int
    instructions: _containers.RepeatedCompositeFieldContainer[InstructionMeasurement]
    energy: float
    sequence: int
    off_plan: _containers.RepeatedCompositeFieldContainer[OffPlanInstruction]
    clock_samples: int
    clock_event_reasons: _containers.RepeatedScalarFieldContainer[str]
    incarnation: int
    clock_control: ClockControl
    transfers: _containers.RepeatedCompositeFieldContainer[TransferMeasurement]
    power_floor: PowerFloorControl
    def __init__(self, job_id: _Optional[str] = ..., rank_id: _Optional[str] = ..., iteration: _Optional[int] = ..., iteration_time: _Optional[float] = ..., plan_version: _Optional[int] = ..., instructions: _Optional[_Iterable[_Union[InstructionMeasurement, _Mapping]]] = ..., energy: _Optional[float] = ..., sequence: _Optional[int] = ..., off_plan: _Optional[_Iterable[_Union[OffPlanInstruction, _Mapping]]] = ..., clock_samples: _Optional[int] = ..., clock_event_reasons: _Optional[_Iterable[str]] = ..., incarnation: _Optional[int] = ..., clock_control: _Optional[_Union[ClockControl, _Mapping]] = ..., transfers: _Optional[_Iterable[_Union[TransferMeasurement, _Mapping]]] = ..., power_floor: _Optional[_Union[PowerFloorControl, _Mapping]] = ...) -> None: ...

class PowerFloorControl(_message.Message):
    __slots__ = ("state", "reason", "plan_swing")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PLAN_SWING_FIELD_NUMBER: _ClassVar[int]
    state: PowerFloorState
    reason: str
    plan_swing: float
    def __init__(self, state: _Optional[_Union[PowerFloorState, str]] = ..., reason: _Optional[str] = ..., plan_swing: _Optional[float] = ...) -> None: ...

class TransferMeasurement(_message.Message):
    __slots__ = ("boundary", "direction", "microbatch", "time")
    BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    boundary: int
    direction: str
    microbatch: int
    time: float
    def __init__(self, boundary: _Optional[int] = ..., direction: _Optional[str] = ..., microbatch: _Optional[int] = ..., time: _Optional[float] = ...) -> None: ...

class OffPlanInstruction(_message.Message):
    __slots__ = ("instruction", "microbatch", "stage", "locked_mhz", "sampled_mhz", "reasons", "samples")
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LOCKED_MHZ_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_MHZ_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    instruction: str
    microbatch: int
    stage: int
    locked_mhz: int
    sampled_mhz: int
    reasons: _containers.RepeatedScalarFieldContainer[str]
    samples: int
    def __init__(self, instruction: _Optional[str] = ..., microbatch: _Optional[int] = ..., stage: _Optional[int] = ..., locked_mhz: _Optional[int] = ..., sampled_mhz: _Optional[int] = ..., reasons: _Optional[_Iterable[str]] = ..., samples: _Optional[int] = ...) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ("accepted", "duplicates")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class FinishRankRequest(_message.Message):
    __slots__ = ("job_id", "rank_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank_id: str
    def __init__(self, job_id: _Optional[str] = ..., rank_id: _Optional[str] = ...) -> None: ...

class FinishRankResponse(_message.Message):
    __slots__ = ("job_finished", "ranks_finished", "ranks_registered")
    JOB_FINISHED_FIELD_NUMBER: _ClassVar[int]
    RANKS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    RANKS_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    job_finished: bool
    ranks_finished: int
    ranks_registered: int
    def __init__(self, job_finished: _Optional[bool] = ..., ranks_finished: _Optional[int] = ..., ranks_registered: _Optional[int] = ...) -> None: ...
