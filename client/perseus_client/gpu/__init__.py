"""GPU backends behind one small interface (:class:`GpuBackend`), one module per vendor.

The vendor is chosen by an availability probe over the registry
:data:`~perseus_client.gpu.vendors.VENDORS`.

- :class:`NvmlGpu`: a real NVIDIA GPU through NVML (``dry_run`` records without applying);
- :class:`DaemonGpu`: a GPU through the node daemon ``perseus gpud`` (no privileges needed);
- :class:`SimulatedGpu`: a DVFS model driven by a Perseus profile (tests, demos);
- :class:`RecordingGpu`: wraps another backend and records every clock request.
"""

from perseus_client.gpu.base import DeviceIdentity, GpuBackend, GpuVendor
from perseus_client.gpu.daemon import AppliedClockReport, DaemonGpu, OffPlanInstruction
from perseus_client.gpu.nvml import NvmlGpu
from perseus_client.gpu.recording import ClockRequest, InstructionRecord, RecordingGpu, read_log
from perseus_client.gpu.simulated import SimulatedGpu, read_profile_csv
from perseus_client.gpu.vendors import VENDORS, choose_vendor

__all__ = [
    "DeviceIdentity",
    "GpuBackend",
    "GpuVendor",
    "VENDORS",
    "choose_vendor",
    "NvmlGpu",
    "DaemonGpu",
    "AppliedClockReport",
    "OffPlanInstruction",
    "SimulatedGpu",
    "RecordingGpu",
    "ClockRequest",
    "InstructionRecord",
    "read_log",
    "read_profile_csv",
]
