"""Perseus rank client: receives per-instruction GPU frequency plans and applies them.

Public API::

    from perseus_client import PerseusClient, SimulatedGpu, NvmlGpu, DaemonGpu, RecordingGpu

    with PerseusClient("localhost:50051", job="job-1", gpu=NvmlGpu(0)) as client:
        with client.iteration():
            with client.instruction("forward", microbatch=0):
                ...

Importing this package is light: it never imports scipy, networkx, fastapi or uvicorn (nor the
Perseus core modules that do). See :mod:`perseus_client.client` for the guarantees.
"""

from perseus_client.client import PerseusClient
from perseus_client.clock_control import FailOpenGpu
from perseus_client.controller import FrequencyController
from perseus_client.errors import (
    ClientError,
    ClockControlUnavailableError,
    ConfigError,
    GpuDriverError,
    GpuError,
    GpuNotSupportedError,
    GpuPermissionError,
    PlanMismatchError,
    UnsupportedClockError,
)
from perseus_client.gpu import (
    AppliedClockReport,
    ClockRequest,
    DaemonGpu,
    GpuBackend,
    InstructionRecord,
    NvmlGpu,
    OffPlanInstruction,
    RecordingGpu,
    SimulatedGpu,
    read_log,
    read_profile_csv,
)
from perseus_client.measurements import InstructionMeasurement, IterationMeasurement
from perseus_client.options import Connection, FailOpen, RankPosition, Reporting
from perseus_client.plan import CompiledPlan, PlanCursor, compile_plan, plan_from_steps

__all__ = [
    "PerseusClient",
    "RankPosition",
    "Connection",
    "FailOpen",
    "Reporting",
    "FrequencyController",
    "GpuBackend",
    "NvmlGpu",
    "DaemonGpu",
    "FailOpenGpu",
    "AppliedClockReport",
    "OffPlanInstruction",
    "SimulatedGpu",
    "RecordingGpu",
    "ClockRequest",
    "InstructionRecord",
    "read_log",
    "read_profile_csv",
    "plan_from_steps",
    "compile_plan",
    "CompiledPlan",
    "PlanCursor",
    "InstructionMeasurement",
    "IterationMeasurement",
    "ClientError",
    "ConfigError",
    "PlanMismatchError",
    "GpuError",
    "ClockControlUnavailableError",
    "GpuPermissionError",
    "GpuNotSupportedError",
    "GpuDriverError",
    "UnsupportedClockError",
]
