"""Exceptions raised by the Perseus rank client.

Everything the client raises derives from :class:`ClientError`, so a training script can catch
one type. GPU backend failures carry an actionable message (what is wrong and how to fix it).
"""

from __future__ import annotations

__all__ = [
    "ClientError",
    "ConfigError",
    "PlanMismatchError",
    "GpuError",
    "ClockControlUnavailableError",
    "GpuPermissionError",
    "GpuNotSupportedError",
    "GpuDriverError",
    "UnsupportedClockError",
    "GpudError",
    "GpudUnavailableError",
    "GpudRefusedError",
    "GpudNotOwnerError",
    "GpudBusyError",
    "GpudLeaseHeldError",
    "GpudPermissionError",
]


class ClientError(Exception):
    """Base class of every error raised by :mod:`perseus_client`."""


class ConfigError(ClientError, ValueError):
    """A constructor argument or environment variable is missing or invalid.

    ``field`` names the argument (or environment variable) at fault.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class PlanMismatchError(ClientError):
    """The instruction the training loop executed is not the plan's next instruction.

    ``executed`` and ``expected`` are ``(kind, microbatch, stage)`` tuples (``expected`` is
    ``None`` when the plan has no instruction left in this iteration; ``executed`` is ``None``
    when the iteration ended before the plan's instructions were all executed).
    """

    def __init__(
        self,
        message: str,
        *,
        executed: tuple[str, int, int | None] | None,
        expected: tuple[str, int, int] | None,
        position: int,
        plan_version: int,
    ) -> None:
        super().__init__(message)
        self.executed = executed
        self.expected = expected
        self.position = position
        self.plan_version = plan_version


class GpuError(ClientError):
    """A GPU backend could not do what was asked."""


class ClockControlUnavailableError(GpuError):
    """Clock control cannot be had now.

    No NVML or driver, no permission, the node daemon unreachable (socket missing, refused, not
    permitted), or the GPU leased by another process.

    A :class:`~perseus_client.PerseusClient` with its default backend never raises these: it
    runs at the GPU's current clocks, retries in the background and reports the reason
    (:class:`~perseus_client.clock_control.FailOpenGpu`). They reach code that builds a backend
    itself (``NvmlGpu(0)``, ``DaemonGpu(0)``).
    """


class GpuPermissionError(ClockControlUnavailableError):
    """Locking clocks needs root or the CAP_SYS_ADMIN capability."""


class GpuNotSupportedError(ClockControlUnavailableError):
    """The GPU or driver does not support the operation (clock locking needs Volta or newer)."""


class GpuDriverError(ClockControlUnavailableError):
    """No NVIDIA driver / NVML library could be loaded, or the device does not exist."""


class UnsupportedClockError(GpuError, ValueError):
    """A requested SM clock is not one of the GPU's supported clocks."""


# --- the node daemon's answers, as its clients see them (perseus_client.gpu.daemon_connection) ---


class GpudError(GpuError):
    """Something went wrong talking to the node daemon ``perseus gpud``."""


class GpudUnavailableError(GpudError, ClockControlUnavailableError):
    """The daemon cannot be reached (no socket, connection refused or closed, timeout)."""


class GpudRefusedError(GpudError):
    """The daemon answered with an error; ``code`` is the ``gpud.proto`` ``ErrorCode`` name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class GpudLeaseHeldError(GpudRefusedError, ClockControlUnavailableError):
    """Another connection (another process) holds the GPU's lease; the message names its pid."""


class GpudPermissionError(GpudRefusedError, GpuPermissionError):
    """The daemon does not allow this process's uid/gid."""


class GpudNotOwnerError(GpudRefusedError, ClockControlUnavailableError):
    """The GPU is not this process's, as far as the daemon can tell.

    No device node of it is open, no pod was given it: for a trainer that asks before CUDA
    opened its GPU, a later try succeeds.
    """


class GpudBusyError(GpudRefusedError, ClockControlUnavailableError):
    """The daemon is at its connection cap or timed the connection out: try again later."""
