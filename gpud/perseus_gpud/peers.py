"""Who is at the other end of a daemon connection (``SO_PEERCRED``), and who may lease."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["Peer", "PeerPolicy", "peer_of"]


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection, as the kernel reports it."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid}"


@dataclass(frozen=True)
class PeerPolicy:
    """Which peers may lease GPUs and use them, and who sees every GPU in status and samples.

    Root, ``uids``, and members of ``gids``; and who sees every GPU in status and samples: root
    and members of ``admin_gids`` (any other peer sees only the GPUs it leases or owns).
    """

    uids: frozenset[int] = frozenset()
    gids: frozenset[int] = frozenset()
    admin_gids: frozenset[int] = frozenset()

    def allows(self, peer: Peer) -> bool:
        """Whether ``peer`` may make calls other than status and heartbeat."""
        if peer.uid == 0 or peer.uid in self.uids:
            return True
        return peer.gid in self.gids or not self.gids.isdisjoint(peer.groups)

    def is_admin(self, peer: Peer) -> bool:
        """Whether ``peer`` sees every GPU (root, or a member of an admin group)."""
        if peer.uid == 0:
            return True
        return peer.gid in self.admin_gids or not self.admin_gids.isdisjoint(peer.groups)

    def describe(self) -> str:
        """The policy in words, for logs and refusals."""
        parts = ["root"]
        if self.uids:
            parts.append("uids " + ", ".join(map(str, sorted(self.uids))))
        if self.gids:
            parts.append("gids " + ", ".join(map(str, sorted(self.gids))))
        return " and ".join(parts)


def _supplementary_groups(pid: int) -> frozenset[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


def peer_of(sock: Any) -> Peer:
    """The credentials of the peer of a connected Unix socket (``SO_PEERCRED``)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid, _supplementary_groups(pid))
