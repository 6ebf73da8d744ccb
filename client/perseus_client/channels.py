"""A gRPC channel from a rank to one server address: its keepalive, reconnect and TLS options.

:func:`open_channel` is what :class:`~perseus_client.transport.ServerLink` opens for the address
it uses now (:class:`~perseus_client.addresses.Endpoint`); a resolved address keeps its name as
the TLS authority. Given several addresses (an active/standby pair), a hung leader is noticed
sooner, so the rank moves to the next server sooner.
"""

from __future__ import annotations

from typing import Any

import grpc

# gRPC imports its channel module on the first ``insecure_channel`` / ``secure_channel`` call; a
# rank constructed after its process dropped privileges could not read it then (see
# :mod:`perseus_client.connect`), so it is imported now.
from grpc import _channel  # noqa: F401

from perseus_client.addresses import Endpoint

__all__ = ["open_channel"]

_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # How long a ping's answer is awaited: 60 s by default in gRPC core, whatever
    # keepalive_timeout_ms says (a hung server was noticed after ~70 s, not 15 s).
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


def open_channel(
    endpoint: Endpoint, *, root_certificates: bytes | None, several: bool
) -> grpc.Channel:
    """A channel to ``endpoint``; a resolved address keeps its name as the TLS authority.

    ``root_certificates``: the CA to trust for TLS (``None``: the system's); ``several``: the
    rank was given several addresses, so a hung server is left sooner.
    """
    opts: dict[str, Any] = dict(_CHANNEL_OPTIONS)
    if several:
        # A leader that hangs (stopped, cut off) is left sooner for the next server: the
        # server accepts a ping every 5 s without data, so 6 s + 3 s is the quickest safe.
        opts.update(
            {
                "grpc.keepalive_time_ms": 6_000,
                "grpc.keepalive_timeout_ms": 3_000,
                "grpc.http2.ping_timeout_ms": 3_000,
            }
        )
    if endpoint.authority is not None:
        opts["grpc.default_authority"] = endpoint.authority
        if endpoint.tls:
            opts["grpc.ssl_target_name_override"] = endpoint.authority.rpartition(":")[0]
    options = list(opts.items())
    if endpoint.tls:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.secure_channel(endpoint.target, creds, options=options)
    return grpc.insecure_channel(endpoint.target, options=options)
