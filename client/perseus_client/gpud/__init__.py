"""``perseus gpud``: the node daemon that lets unprivileged trainers lock GPU clocks.

One daemon runs as root per node. Trainers (through :class:`~perseus_client.gpu.daemon.DaemonGpu`)
lease their GPU (by UUID, only one they own) on a Unix-socket connection and ask it to lock or reset the SM clock; the daemon
checks the peer's credentials and the clock, and resets a GPU as soon as its holder's connection
closes (whatever killed the holder) or stops heartbeating. See ``docs/gpud.md``.

Modules, one job each: :mod:`~perseus_client.gpud.protocol` (frames, errors, socket location),
:mod:`~perseus_client.gpud.connection` (blocking client connection),
:mod:`~perseus_client.gpud.server` (asyncio server, leases),
:mod:`~perseus_client.gpud.access` (who sees and reads which GPU, lease labels, the socket),
:mod:`~perseus_client.gpud.peers` (peer credentials and who may lease),
:mod:`~perseus_client.gpud.ownership` (which GPUs a peer owns: device nodes, the kubelet's
pod-resources API, stubs ``podresources_pb2*``), :mod:`~perseus_client.gpud.procfs` (what
``/proc`` says about a peer), :mod:`~perseus_client.gpud.lockrecord` (the clocks gpud left
locked, ``--state``), :mod:`~perseus_client.gpud.limits` (connection caps and timeouts),
:mod:`~perseus_client.gpud.metrics` (Prometheus text), :mod:`~perseus_client.gpud.files`
(files written safely: mkstemp, no link followed),
:mod:`~perseus_client.gpud.devices` (the NVML access layer),
:mod:`~perseus_client.gpud.simnvml` (the simulated NVML stand-in) and
:mod:`~perseus_client.gpud.cli` (``main(argv)``: ``serve`` and ``status``). Importing this
package loads only the protocol and the client connection; the daemon's modules load on use.
"""

from __future__ import annotations

from perseus_client.gpud.connection import GpudConnection
from perseus_client.gpud.protocol import (
    DEFAULT_SOCKET,
    MAX_FRAME,
    SOCKET_ENV,
    GpudError,
    GpudLeaseHeldError,
    GpudPermissionError,
    GpudRefusedError,
    GpudUnavailableError,
)

__all__ = [
    "main",
    "GpudConnection",
    "DEFAULT_SOCKET",
    "SOCKET_ENV",
    "MAX_FRAME",
    "GpudError",
    "GpudUnavailableError",
    "GpudRefusedError",
    "GpudLeaseHeldError",
    "GpudPermissionError",
]


def main(argv: list[str] | None = None) -> int:
    """``perseus gpud`` with ``argv`` (the arguments after ``gpud``); returns the exit status."""
    from perseus_client.gpud.cli import main as cli_main

    return cli_main(argv)
