"""The client's defaults from the environment, and the default GPU backend they select.

The defaults are read in one place (:class:`Environment`).

=========================  ============================================================
``PERSEUS_SERVER``         the server's address (``host:port``, ``grpcs://host:port``), or
                           several, comma-separated (``a:50051,b:50051``: an active/standby
                           pair; the client follows the leader)
``PERSEUS_JOB``            the job id
``PERSEUS_TOKEN``          the bearer token
``PERSEUS_TLS_CA``         a PEM file of a private CA (implies TLS)
``RANK``                   the global rank (default 0)
``LOCAL_RANK``             which of the node's GPUs (default 0; see :mod:`.gpu.discovery`)
``PERSEUS_DRY_RUN``        record clock requests without applying them
``PERSEUS_GPUD_SOCKET``    the node daemon's socket (default ``/run/perseus/gpud.sock``)
=========================  ============================================================

Values are parsed when used, so a malformed variable raises
:class:`~perseus_client.errors.ConfigError` (naming it) only where it matters: ``RANK`` when no
rank was given, ``LOCAL_RANK`` when the default backend is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from perseus_client.clock_control import FailOpenGpu
from perseus_client.errors import ConfigError
from perseus_client.gpu.base import GpuBackend

__all__ = ["Environment", "backend_factory", "default_gpu", "env_int"]


def env_int(name: str, value: int | None, default: int) -> int:
    """``value`` if given, else the integer in ``$name`` (``default`` when unset or empty)."""
    return Environment.read().integer(name, value, default)


@dataclass(frozen=True)
class Environment:
    """The client's environment variables as read once (see the module docstring)."""

    server: str | None = None
    job: str | None = None
    token: str | None = None
    tls_ca: str | None = None
    rank: str | None = None
    local_rank: str | None = None
    dry_run: bool = False
    gpud_socket: str | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        """Read the ``PERSEUS_*`` variables (and the rank's) from ``environ``.

        ``environ`` defaults to ``os.environ``.
        """
        env = os.environ if environ is None else environ
        return cls(
            server=env.get("PERSEUS_SERVER"),
            job=env.get("PERSEUS_JOB"),
            token=env.get("PERSEUS_TOKEN") or None,
            tls_ca=env.get("PERSEUS_TLS_CA") or None,
            rank=env.get("RANK"),
            local_rank=env.get("LOCAL_RANK"),
            dry_run=env.get("PERSEUS_DRY_RUN", "") not in ("", "0", "false"),
            gpud_socket=env.get("PERSEUS_GPUD_SOCKET") or None,
        )

    def integer(self, name: str, value: int | None, default: int) -> int:
        """``value`` if given, else the variable ``name`` as an integer.

        ``name`` is ``RANK`` or ``LOCAL_RANK``; ``default`` when unset or empty; a malformed
        one raises ConfigError.
        """
        if value is not None:
            return int(value)
        raw = {"RANK": self.rank, "LOCAL_RANK": self.local_rank}[name]
        if raw is None or not raw.strip():
            return default
        try:
            return int(raw)
        except ValueError as exc:
            raise ConfigError(name, f"must be an integer, got {raw!r}") from exc


def backend_factory(env: Environment | None = None) -> Callable[[], GpuBackend]:
    """What builds the default backend.

    The node daemon's GPU when a daemon socket is configured or present, else the GPU of the
    vendor the availability probe finds (NVML's when none:
    :func:`~perseus_client.gpu.vendors.choose_vendor`; ``PERSEUS_DRY_RUN``: the vendor's,
    recording requests only).

    The environment is read here, so a malformed variable raises now (a configuration error);
    the factory itself raises :class:`ClockControlUnavailableError` while control cannot be had.
    """
    from perseus_common.gpud_wire import DEFAULT_SOCKET

    env = Environment.read() if env is None else env
    index = env.integer("LOCAL_RANK", None, 0)
    if index < 0:
        raise ConfigError("LOCAL_RANK", f"must be >= 0, got {index}")
    dry_run = env.dry_run
    socket = env.gpud_socket
    if not dry_run and (socket or os.path.exists(DEFAULT_SOCKET)):

        def daemon() -> GpuBackend:
            from perseus_client.gpu.daemon import DaemonGpu

            # Its GPU from CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES and LOCAL_RANK, leased
            # by UUID. No wait for the daemon here: FailOpenGpu retries in the background.
            return DaemonGpu(socket=socket or DEFAULT_SOCKET, connect_timeout=0.0)

        return daemon

    from perseus_client.gpu.vendors import choose_vendor

    vendor = choose_vendor()

    def local() -> GpuBackend:
        return vendor.open(index, dry_run)

    return local


def default_gpu(
    retry_initial: float = 1.0, retry_max: float = 30.0, env: Environment | None = None
) -> FailOpenGpu:
    """The default backend behind :class:`FailOpenGpu`.

    It never raises because clock control is unavailable (see
    :mod:`perseus_client.clock_control`).
    """
    return FailOpenGpu(backend_factory(env), retry_initial=retry_initial, retry_max=retry_max)
