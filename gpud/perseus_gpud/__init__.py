"""``perseus gpud``: the node daemon that lets unprivileged trainers lock GPU clocks.

One daemon runs as root per node. Trainers (through :class:`~perseus_client.gpu.daemon.DaemonGpu`)
lease their GPU (by UUID, only one they own) on a Unix-socket connection and ask it to lock or
reset the SM clock; the daemon checks the peer's credentials and the clock, and resets a GPU as
soon as its holder's connection closes (whatever killed the holder) or stops heartbeating. See
``docs/gpud.md``.

The daemon is a package of its own, installed with ``pip install 'perseus[gpud]'``: it opens
GPUs through the rank client's GPU layer (:mod:`perseus_client.gpu`), never the other way round.
What both ends of the socket share is in the shared vocabulary: the messages
(``perseus_common/proto/gpud.proto``) and the frames and socket location
(:mod:`perseus_common.gpud_wire`); the client's connection to the daemon and the errors it
sees are the client's (:mod:`perseus_client.gpu.daemon_connection`,
:mod:`perseus_client.errors`).

Modules, one job each: :mod:`~perseus_gpud.server` (asyncio server, leases),
:mod:`~perseus_gpud.access` (who sees and reads which GPU, lease labels, the socket),
:mod:`~perseus_gpud.peers` (peer credentials and who may lease),
:mod:`~perseus_gpud.ownership` (which GPUs a peer owns: device nodes, the kubelet's
pod-resources API, stubs ``podresources_pb2*``), :mod:`~perseus_gpud.procfs` (what
``/proc`` says about a peer), :mod:`~perseus_gpud.lockrecord` (the clocks gpud left
locked, ``--state``), :mod:`~perseus_gpud.limits` (connection caps and timeouts),
:mod:`~perseus_gpud.metrics` (Prometheus text), :mod:`~perseus_gpud.files`
(files written safely: mkstemp, no link followed),
:mod:`~perseus_gpud.devices` (the NVML access layer),
:mod:`~perseus_gpud.simnvml` (the simulated NVML stand-in) and
:mod:`~perseus_gpud.cli` (``main(argv)``: ``serve`` and ``status``). Importing this
package loads none of them; they load on use.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``perseus gpud`` with ``argv`` (the arguments after ``gpud``); returns the exit status."""
    from perseus_gpud.cli import main as cli_main

    return cli_main(argv)
