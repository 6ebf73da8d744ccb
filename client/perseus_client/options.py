"""The :class:`~perseus_client.PerseusClient`'s options, grouped into small frozen values.

As httpx groups ``Timeout`` and ``Limits``; each is checked when built.

- :class:`RankPosition` — where the rank sits in its job: global, pipeline (stage), data-parallel
  and tensor-parallel rank;
- :class:`Connection` — reaching the server: TLS trust, the RPC timeout, the reconnection
  backoff;
- :class:`FailOpen` — what happens when the server or clock control is away: how long the
  server may be unreachable before iterations run at the maximum clock, and the backoff of the
  default backend's retries while clock control is unavailable;
- :class:`Reporting` — what each iteration reports and how often: the batch interval,
  per-instruction measurements, CUDA-event timing, the applied-clock sampling interval.

A value that cannot be right raises :class:`~perseus_client.errors.ConfigError` naming the
field. Defaults that come from the environment (``RANK``, ``PERSEUS_TLS_CA``...) are ``None``
here and read by :mod:`perseus_client.defaults`, in one place.

Example::

    PerseusClient(
        "scheduler:50051",
        job="gpt3",
        rank=RankPosition(pipeline_rank=3, data_rank=1),
        connection=Connection(rpc_timeout=2.0),
        reporting=Reporting(report_interval=1.0),
    )
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perseus_client.errors import ConfigError

__all__ = ["Connection", "FailOpen", "RankPosition", "Reporting"]


def _seconds(field: str, value: float, *, positive: bool = False) -> None:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ConfigError(field, f"must be {'>' if positive else '>='} 0 seconds, got {value}")


@dataclass(frozen=True)
class RankPosition:
    """The rank's place in its job.

    Attributes:
        global_rank: its rank in the whole job (``None``: ``$RANK``, else 0).
        pipeline_rank: its stage index in its pipeline.
        data_rank: which data-parallel pipeline it belongs to.
        tensor_rank: its tensor-parallel index.
    """

    global_rank: int | None = None
    pipeline_rank: int = 0
    data_rank: int = 0
    tensor_rank: int = 0

    def __post_init__(self) -> None:
        if self.global_rank is not None:
            object.__setattr__(self, "global_rank", int(self.global_rank))
        for name in ("pipeline_rank", "data_rank", "tensor_rank"):
            value = int(getattr(self, name))
            if value < 0:
                raise ConfigError(name, f"must be >= 0, got {value}")
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class Connection:
    """Reaching the server.

    Attributes:
        tls_ca: path of a PEM file of the server's CA (``None``: ``$PERSEUS_TLS_CA``); with one,
            gRPC uses TLS (unless the address says ``grpc://``).
        tls_root_certificates: PEM roots for ``grpcs://`` (``None``: the system's).
        rpc_timeout: seconds one registration or report call may take.
        backoff_initial, backoff_max: bounds of the reconnection backoff (doubling, with
            jitter), seconds.
    """

    tls_ca: str | None = None
    tls_root_certificates: bytes | None = None
    rpc_timeout: float = 5.0
    backoff_initial: float = 0.1
    backoff_max: float = 5.0

    def __post_init__(self) -> None:
        _seconds("rpc_timeout", self.rpc_timeout, positive=True)
        _seconds("backoff_initial", self.backoff_initial, positive=True)
        _seconds("backoff_max", self.backoff_max, positive=True)


@dataclass(frozen=True)
class FailOpen:
    """Training goes on when the scheduler or clock control is away.

    Attributes:
        server_timeout: seconds of unreachable server after which iterations run at the maximum
            clock (until it is back).
        clock_retry_initial, clock_retry_max: bounds of the default backend's retry backoff while
            clock control is unavailable, seconds.
    """

    server_timeout: float = 10.0
    clock_retry_initial: float = 1.0
    clock_retry_max: float = 30.0

    def __post_init__(self) -> None:
        _seconds("server_timeout", self.server_timeout)
        _seconds("clock_retry_initial", self.clock_retry_initial, positive=True)
        if not self.clock_retry_max >= self.clock_retry_initial:
            raise ConfigError(
                "clock_retry_max",
                f"must be >= clock_retry_initial ({self.clock_retry_initial}), "
                f"got {self.clock_retry_max}",
            )


@dataclass(frozen=True)
class Reporting:
    """What each iteration reports, and how often.

    Attributes:
        report_interval: seconds between batched ``ReportIterations`` calls.
        measure_instructions: report each instruction's time (and energy while profiling).
        cuda_events: time instructions and order clock changes with CUDA events (``None``: when
            the backend is a real GPU and torch with CUDA is already imported).
        clock_sample_interval: seconds between applied-clock samples taken off the training
            thread (0: none); off-plan instructions travel with the reports.
    """

    report_interval: float = 0.5
    measure_instructions: bool = True
    cuda_events: bool | None = None
    clock_sample_interval: float = 0.05

    def __post_init__(self) -> None:
        _seconds("report_interval", self.report_interval, positive=True)
        _seconds("clock_sample_interval", self.clock_sample_interval)
