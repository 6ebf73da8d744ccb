"""``perseus_gpud.peers``: who is at the other end of the socket, and who may lease or see all."""

from __future__ import annotations

import os
import socket

from perseus_gpud.peers import Peer, PeerPolicy, peer_of


def test_the_peer_of_a_unix_socket_is_the_kernels_word() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        peer = peer_of(a)
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert peer.groups == frozenset(os.getgroups())  # read from /proc/PID/status
    assert str(peer) == f"pid {os.getpid()} uid {os.getuid()}"


def test_root_listed_uids_and_groups_may_lease_no_one_else() -> None:
    policy = PeerPolicy(uids=frozenset({1000}), gids=frozenset({50}))
    assert policy.allows(Peer(1, 0, 0))
    assert policy.allows(Peer(1, 1000, 1000))
    assert policy.allows(Peer(1, 1001, 50))  # primary group
    assert policy.allows(Peer(1, 1001, 1001, frozenset({7, 50})))  # supplementary group
    assert not policy.allows(Peer(1, 1001, 1001, frozenset({7})))
    assert not PeerPolicy().allows(Peer(1, 1000, 1000))  # by default root only


def test_only_root_and_admin_groups_see_every_gpu() -> None:
    policy = PeerPolicy(uids=frozenset({1000}), admin_gids=frozenset({60}))
    assert policy.is_admin(Peer(1, 0, 0))
    assert not policy.is_admin(Peer(1, 1000, 1000))  # may lease, but sees only its own
    assert policy.is_admin(Peer(1, 1000, 60))
    assert policy.is_admin(Peer(1, 1000, 1000, frozenset({60})))


def test_the_policy_in_words() -> None:
    assert PeerPolicy().describe() == "root"
    policy = PeerPolicy(uids=frozenset({1001, 1000}), gids=frozenset({50}))
    assert policy.describe() == "root and uids 1000, 1001 and gids 50"
