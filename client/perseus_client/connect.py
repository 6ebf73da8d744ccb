"""How a :class:`~perseus_client.client.PerseusClient` reaches its server.

The server addresses and their TLS trust, checked before anything starts; the rank's registration;
the link (not started).

Everything a connected client uses is imported with this module (the transport, gRPC's channel
module, the addresses and the wire): a launcher may import the client and then drop privileges or
enter a sandbox before it constructs one, and from then on a tree only its owner may enter (a
``.venv`` in a 0700 home directory) can no longer be read. That costs an offline client about
60 ms more at import.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Protocol

from perseus_client.addresses import TLS_CA_ENV, ServerAddress, parse_servers, read_ca_file
from perseus_client.defaults import Environment
from perseus_client.gpu.base import GpuBackend
from perseus_client.options import Connection, Reporting
from perseus_client.transport import ServerLink
from perseus_common.wire.values import PlanUpdate, RankRegistration

__all__ = ["RankPlace", "open_link", "rank_registration", "server_addresses"]


class RankPlace(Protocol):
    """Where a rank sits in its job (what a registration names)."""

    global_rank: int
    pipeline_rank: int
    data_rank: int
    tensor_rank: int


def server_addresses(
    server: str | Sequence[str], connection: Connection, env: Environment
) -> tuple[tuple[ServerAddress, ...], bytes | None]:
    """Return the server addresses, checked, and the TLS root certificates.

    ``server`` is one address, several comma-separated, or a list
    (:func:`~perseus_client.addresses.parse_servers`). An explicit root or a CA
    (``connection.tls_ca``, else ``$PERSEUS_TLS_CA``) means TLS for every address that does not
    say plain gRPC (``grpc://``).
    """
    roots = connection.tls_root_certificates
    if roots is None and connection.tls_ca:
        roots = read_ca_file(connection.tls_ca, "tls_ca")
    elif roots is None and env.tls_ca:
        roots = read_ca_file(env.tls_ca, TLS_CA_ENV)
    return parse_servers(server, tls_default=roots is not None), roots


def rank_registration(job: str, rank: RankPlace, gpu: GpuBackend) -> RankRegistration:
    """The rank's registration: its job, place, GPU and host."""
    return RankRegistration(
        job_id=job,
        global_rank=rank.global_rank,
        pipeline_rank=rank.pipeline_rank,
        data_rank=rank.data_rank,
        tensor_rank=rank.tensor_rank,
        gpu_name=gpu.name,
        supported_clocks_mhz=tuple(gpu.supported_clocks()),
        hostname=socket.gethostname(),
        max_power_limit_w=gpu.max_power_limit_w() or 0.0,
    )


def open_link(
    addresses: Sequence[ServerAddress],
    registration: RankRegistration,
    on_plan: Callable[[PlanUpdate], None],
    token: str | None,
    roots: bytes | None,
    connection: Connection,
    reporting: Reporting,
) -> ServerLink:
    """The rank's link to the server (registration, plans, reports; not started)."""
    return ServerLink(
        addresses,
        registration,
        on_plan,
        token=token,
        root_certificates=roots,
        rpc_timeout=connection.rpc_timeout,
        backoff_initial=connection.backoff_initial,
        backoff_max=connection.backoff_max,
        report_interval=reporting.report_interval,
    )
