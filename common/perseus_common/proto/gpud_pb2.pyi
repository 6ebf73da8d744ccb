from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    INVALID_ARGUMENT: _ClassVar[ErrorCode]
    PERMISSION_DENIED: _ClassVar[ErrorCode]
    NOT_FOUND: _ClassVar[ErrorCode]
    LEASE_HELD: _ClassVar[ErrorCode]
    NOT_LEASED: _ClassVar[ErrorCode]
    UNSUPPORTED_CLOCK: _ClassVar[ErrorCode]
    DEVICE_ERROR: _ClassVar[ErrorCode]
    TOO_LARGE: _ClassVar[ErrorCode]
    NOT_OWNER: _ClassVar[ErrorCode]
    BUSY: _ClassVar[ErrorCode]
    TIMEOUT: _ClassVar[ErrorCode]
ERROR_CODE_UNSPECIFIED: ErrorCode
INVALID_ARGUMENT: ErrorCode
PERMISSION_DENIED: ErrorCode
NOT_FOUND: ErrorCode
LEASE_HELD: ErrorCode
NOT_LEASED: ErrorCode
UNSUPPORTED_CLOCK: ErrorCode
DEVICE_ERROR: ErrorCode
TOO_LARGE: ErrorCode
NOT_OWNER: ErrorCode
BUSY: ErrorCode
TIMEOUT: ErrorCode

class Request(_message.Message):
    __slots__ = ("id", "lease", "release", "set_clock", "reset_clock", "supported_clocks", "energy", "sample", "status", "heartbeat", "set_power_floor")
    ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    SET_CLOCK_FIELD_NUMBER: _ClassVar[int]
    RESET_CLOCK_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_CLOCKS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SET_POWER_FLOOR_FIELD_NUMBER: _ClassVar[int]
    id: int
    lease: GpuRef
    release: GpuRef
    set_clock: SetClock
    reset_clock: GpuRef
    supported_clocks: GpuRef
    energy: GpuRef
    sample: GpuRef
    status: Empty
    heartbeat: Empty
    set_power_floor: SetPowerFloor
    def __init__(self, id: _Optional[int] = ..., lease: _Optional[_Union[GpuRef, _Mapping]] = ..., release: _Optional[_Union[GpuRef, _Mapping]] = ..., set_clock: _Optional[_Union[SetClock, _Mapping]] = ..., reset_clock: _Optional[_Union[GpuRef, _Mapping]] = ..., supported_clocks: _Optional[_Union[GpuRef, _Mapping]] = ..., energy: _Optional[_Union[GpuRef, _Mapping]] = ..., sample: _Optional[_Union[GpuRef, _Mapping]] = ..., status: _Optional[_Union[Empty, _Mapping]] = ..., heartbeat: _Optional[_Union[Empty, _Mapping]] = ..., set_power_floor: _Optional[_Union[SetPowerFloor, _Mapping]] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("id", "error", "lease", "clock", "supported_clocks", "energy", "sample", "status", "heartbeat", "power_floor")
    ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_CLOCKS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    POWER_FLOOR_FIELD_NUMBER: _ClassVar[int]
    id: int
    error: Error
    lease: Lease
    clock: ClockState
    supported_clocks: GpuInfo
    energy: Energy
    sample: Sample
    status: Status
    heartbeat: Empty
    power_floor: PowerFloorState
    def __init__(self, id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., clock: _Optional[_Union[ClockState, _Mapping]] = ..., supported_clocks: _Optional[_Union[GpuInfo, _Mapping]] = ..., energy: _Optional[_Union[Energy, _Mapping]] = ..., sample: _Optional[_Union[Sample, _Mapping]] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., heartbeat: _Optional[_Union[Empty, _Mapping]] = ..., power_floor: _Optional[_Union[PowerFloorState, _Mapping]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GpuRef(_message.Message):
    __slots__ = ("index", "uuid", "job", "tenant")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    job: str
    tenant: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., job: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class SetClock(_message.Message):
    __slots__ = ("index", "mhz", "uuid")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MHZ_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    index: int
    mhz: int
    uuid: str
    def __init__(self, index: _Optional[int] = ..., mhz: _Optional[int] = ..., uuid: _Optional[str] = ...) -> None: ...

class SetPowerFloor(_message.Message):
    __slots__ = ("index", "uuid", "watts", "ramp_w_per_s")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    WATTS_FIELD_NUMBER: _ClassVar[int]
    RAMP_W_PER_S_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    watts: float
    ramp_w_per_s: float
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., watts: _Optional[float] = ..., ramp_w_per_s: _Optional[float] = ...) -> None: ...

class PowerFloorState(_message.Message):
    __slots__ = ("index", "uuid", "watts", "applied", "unavailable")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    WATTS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    watts: float
    applied: bool
    unavailable: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., watts: _Optional[float] = ..., applied: _Optional[bool] = ..., unavailable: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "name", "supported_clocks_mhz", "uuid", "max_power_limit_w", "floor_unavailable")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_CLOCKS_MHZ_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MAX_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    FLOOR_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    supported_clocks_mhz: _containers.RepeatedScalarFieldContainer[int]
    uuid: str
    max_power_limit_w: float
    floor_unavailable: str
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., supported_clocks_mhz: _Optional[_Iterable[int]] = ..., uuid: _Optional[str] = ..., max_power_limit_w: _Optional[float] = ..., floor_unavailable: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("gpu", "lease_timeout_s", "read_only")
    GPU_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    gpu: GpuInfo
    lease_timeout_s: float
    read_only: bool
    def __init__(self, gpu: _Optional[_Union[GpuInfo, _Mapping]] = ..., lease_timeout_s: _Optional[float] = ..., read_only: _Optional[bool] = ...) -> None: ...

class ClockState(_message.Message):
    __slots__ = ("index", "uuid", "locked_mhz", "applied")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    LOCKED_MHZ_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    locked_mhz: int
    applied: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., locked_mhz: _Optional[int] = ..., applied: _Optional[bool] = ...) -> None: ...

class Energy(_message.Message):
    __slots__ = ("index", "energy_mj")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENERGY_MJ_FIELD_NUMBER: _ClassVar[int]
    index: int
    energy_mj: int
    def __init__(self, index: _Optional[int] = ..., energy_mj: _Optional[int] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("index", "sm_mhz", "locked_mhz", "reasons", "reason_names")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SM_MHZ_FIELD_NUMBER: _ClassVar[int]
    LOCKED_MHZ_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    REASON_NAMES_FIELD_NUMBER: _ClassVar[int]
    index: int
    sm_mhz: int
    locked_mhz: int
    reasons: int
    reason_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., sm_mhz: _Optional[int] = ..., locked_mhz: _Optional[int] = ..., reasons: _Optional[int] = ..., reason_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Holder(_message.Message):
    __slots__ = ("pid", "uid", "pod", "namespace", "slurm_job", "owned_by", "job", "tenant")
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_FIELD_NUMBER: _ClassVar[int]
    OWNED_BY_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    pid: int
    uid: int
    pod: str
    namespace: str
    slurm_job: str
    owned_by: str
    job: str
    tenant: str
    def __init__(self, pid: _Optional[int] = ..., uid: _Optional[int] = ..., pod: _Optional[str] = ..., namespace: _Optional[str] = ..., slurm_job: _Optional[str] = ..., owned_by: _Optional[str] = ..., job: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class GpuStatus(_message.Message):
    __slots__ = ("index", "name", "locked_mhz", "holder", "uuid")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOCKED_MHZ_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    locked_mhz: int
    holder: Holder
    uuid: str
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., locked_mhz: _Optional[int] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., uuid: _Optional[str] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("gpus", "read_only", "lease_timeout_s")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuStatus]
    read_only: bool
    lease_timeout_s: float
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuStatus, _Mapping]]] = ..., read_only: _Optional[bool] = ..., lease_timeout_s: _Optional[float] = ...) -> None: ...
