"""The client's defaults from the environment: integers such as ``RANK`` and the default GPU
backend (the node daemon's GPU when a daemon socket is configured or present, else NVML's, behind
:class:`~perseus_client.clock_control.FailOpenGpu`)."""

from __future__ import annotations

import os
from collections.abc import Callable

from perseus_client.clock_control import FailOpenGpu
from perseus_client.errors import ConfigError
from perseus_client.gpu.base import GpuBackend

__all__ = ["backend_factory", "default_gpu", "env_int"]


def env_int(name: str, value: int | None, default: int) -> int:
    if value is not None:
        return int(value)
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from exc


def backend_factory() -> Callable[[], GpuBackend]:
    """What builds the default backend: the node daemon's GPU when a daemon socket is configured
    or present, else the GPU of the vendor the availability probe finds (NVML's when none:
    :func:`~perseus_client.gpu.vendors.choose_vendor`; ``PERSEUS_DRY_RUN``: the vendor's,
    recording requests only).

    The environment is read here, so a malformed variable raises now (a configuration error);
    the factory itself raises :class:`ClockControlUnavailableError` while control cannot be had.
    """
    from perseus_client.gpud.protocol import DEFAULT_SOCKET, SOCKET_ENV

    index = env_int("LOCAL_RANK", None, 0)
    if index < 0:
        raise ConfigError("LOCAL_RANK", f"must be >= 0, got {index}")
    dry_run = os.environ.get("PERSEUS_DRY_RUN", "") not in ("", "0", "false")
    if not dry_run and (os.environ.get(SOCKET_ENV) or os.path.exists(DEFAULT_SOCKET)):

        def daemon() -> GpuBackend:
            from perseus_client.gpu.daemon import DaemonGpu

            # Its GPU from CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES and LOCAL_RANK, leased
            # by UUID. No wait for the daemon here: FailOpenGpu retries in the background.
            return DaemonGpu(connect_timeout=0.0)

        return daemon

    from perseus_client.gpu.vendors import choose_vendor

    vendor = choose_vendor()

    def local() -> GpuBackend:
        return vendor.open(index, dry_run)

    return local


def default_gpu(retry_initial: float = 1.0, retry_max: float = 30.0) -> FailOpenGpu:
    """The default backend behind :class:`FailOpenGpu`: never raises because clock control is
    unavailable (see :mod:`perseus_client.clock_control`)."""
    return FailOpenGpu(backend_factory(), retry_initial=retry_initial, retry_max=retry_max)
