"""Who may do what with which GPU, for the daemon's server; and the socket it listens on.

The owner a lease goes to, what a peer sees in status, whose GPU a peer may read, the labels a lease
may carry; and the socket the daemon listens on.

Root and the admin groups (:meth:`~perseus_gpud.peers.PeerPolicy.is_admin`) see and read
every GPU; any other peer only the GPUs it leases or owns (:mod:`~perseus_gpud.ownership`),
so a tenant learns nothing of another's GPUs, clocks or holders. Refusals raise :class:`Refused`,
which the server answers as an ``Error`` frame.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Collection, Mapping

from perseus_common.proto import gpud_pb2
from perseus_gpud.devices import ManagedGpu
from perseus_gpud.ownership import Denied, Owner, Ownership
from perseus_gpud.peers import Peer, PeerPolicy

__all__ = [
    "MAX_TAG",
    "Access",
    "GpudStartError",
    "Refused",
    "error_response",
    "lease_tag",
    "listen_unix",
]

#: The longest job or tenant label a lease may carry.
MAX_TAG = 128


class GpudStartError(RuntimeError):
    """The daemon cannot start (socket path in use, not a socket, ...)."""


class Refused(Exception):
    """A request refused with ``code`` (``uuid``: the GPU it named, for the metrics)."""

    def __init__(self, code: gpud_pb2.ErrorCode, message: str, uuid: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.uuid = uuid


def error_response(req_id: int, code: gpud_pb2.ErrorCode, message: str) -> gpud_pb2.Response:
    """The ``Response`` carrying a refusal."""
    return gpud_pb2.Response(id=req_id, error=gpud_pb2.Error(code=code, message=message))


def lease_tag(value: str, field_name: str) -> str:
    """A lease's job or tenant label, checked (printable, at most :data:`MAX_TAG` characters)."""
    if len(value) > MAX_TAG:
        raise Refused(
            gpud_pb2.INVALID_ARGUMENT,
            f"{field_name}: at most {MAX_TAG} characters, got {len(value)}",
        )
    if not value.isprintable():
        raise Refused(gpud_pb2.INVALID_ARGUMENT, f"{field_name}: must be printable text")
    return value


class Access:
    """The rules above, over the daemon's peer policy and ownership check."""

    def __init__(self, policy: PeerPolicy, ownership: Ownership) -> None:
        self.policy = policy
        self.ownership = ownership

    async def lease_owner(self, peer: Peer, gpu: ManagedGpu) -> Owner:
        """Why ``peer`` owns ``gpu`` (raises :class:`Refused` ``NOT_OWNER`` when it does not)."""
        owner = await self.ownership.check(peer.pid, gpu.uuid, gpu.minor)
        if isinstance(owner, Owner):
            return owner
        hint = (
            " (the daemon sees pid 0: it needs the host's pid namespace, hostPID: true)"
            if peer.pid == 0
            else ""
        )
        raise Refused(
            gpud_pb2.NOT_OWNER,
            f"GPU {gpu.index} ({gpu.uuid}) is not pid {peer.pid}'s: {owner.reason}; gpud leases "
            f"a GPU only when {self.ownership.describe()}{hint}. Lease the GPU this process "
            "was given (CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES), after CUDA opened it",
        )

    async def visible(
        self,
        peer: Peer,
        allowed: bool,
        leases: Collection[int],
        gpus: Mapping[int, ManagedGpu],
    ) -> set[int] | None:
        """The GPUs ``peer`` may see in status (``None``: all, for root and admins).

        Those its connection leases and, for an allowed peer, those it owns.
        """
        if self.policy.is_admin(peer):
            return None
        seen = set(leases)
        for index, gpu in gpus.items():
            if index not in seen and allowed:
                owner = await self.ownership.check(peer.pid, gpu.uuid, gpu.minor)
                if isinstance(owner, Owner):
                    seen.add(index)
        return seen

    async def may_read(self, peer: Peer, leases: Collection[int], gpu: ManagedGpu) -> None:
        """Refuse a read of ``gpu`` by a peer that neither leases nor owns it.

        A read is of clocks, energy or samples; root and admins read every GPU.
        """
        if gpu.index in leases or self.policy.is_admin(peer):
            return
        owner = await self.ownership.check(peer.pid, gpu.uuid, gpu.minor)
        if isinstance(owner, Denied):
            raise Refused(
                gpud_pb2.NOT_OWNER,
                f"GPU {gpu.index} ({gpu.uuid}) is not pid {peer.pid}'s: {owner.reason}",
            )


async def listen_unix(
    path: str,
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    gid: int | None,
    mode: int,
) -> asyncio.AbstractServer:
    """Listen on the Unix socket ``path``, group ``gid``, ``mode``.

    A stale socket of a dead daemon is replaced; anything else there, or a live daemon, raises
    :class:`GpudStartError`.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o755, exist_ok=True)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise GpudStartError(f"{path} exists and is not a socket; remove it or pick another")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # a stale socket of a daemon that died
        else:
            raise GpudStartError(f"another daemon is already serving on {path}")
        finally:
            probe.close()
    old = os.umask(0o177)  # no window in which others may connect
    try:
        server = await asyncio.start_unix_server(handler, path=path, backlog=256)
    finally:
        os.umask(old)
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, mode)
    return server
