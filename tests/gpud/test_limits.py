"""Connections to a real ``perseus gpud --simulate`` from real processes.

Idle connections of peers that may not lease cannot lock trainers out (per-uid cap, a reserve for
allowed peers, the open-file limit raised), idle non-leasing connections and partial frames time
out, a leasing connection is governed by its lease alone, and a trainer connects through a read-only
mount of the socket's directory (the kit's trainer pods).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import gpud_harness
import pytest
from gpud_harness import NOBODY, NOGROUP, Daemon, PeerProcess, holder, wait_for

from perseus_client.gpu.daemon_connection import GpudConnection
from perseus_common.gpud_wire import read_frame
from perseus_common.proto import gpud_pb2

workdir = gpud_harness.workdir
start_daemon = gpud_harness.start_daemon
start_peer = gpud_harness.start_peer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")


def raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20.0)
    s.connect(path)
    return s


def closing_reply(s: socket.socket) -> gpud_pb2.Response:
    """The error frame the daemon sends before it closes the connection; then end of stream."""
    reply = gpud_pb2.Response.FromString(read_frame(s))
    assert s.recv(1) == b""
    return reply


@pytest.mark.slow
def test_idle_connections_of_other_uids_do_not_lock_a_trainer_out(
    start_daemon: Callable[..., Daemon], start_peer: Callable[..., PeerProcess]
) -> None:
    daemon = start_daemon(
        "--simulate", "1", "--allow-uid", str(NOBODY), "--group", "nogroup",
        "--max-connections", "12", "--max-connections-per-uid", "4",
        "--reserved-connections", "4",
        nofile=64,
    )  # fmt: skip
    # The soft open-file limit it was started with (64) was raised to the hard limit.
    assert daemon.proc is not None
    limits = Path(f"/proc/{daemon.proc.pid}/limits").read_text().splitlines()
    line = next(ln for ln in limits if ln.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    assert soft == hard and int(soft) > 64

    # Three uids in the socket's group that may not lease open idle connections in bulk.
    flood = [
        start_peer(daemon.socket, "--uid", str(uid), "--gid", str(NOGROUP))
        for uid in (12345, 12346, 12347)
    ]
    assert flood[0].cmd("connect 10") == {"open": 10, "busy": 6}  # 4 per uid
    assert flood[1].cmd("connect 10") == {"open": 10, "busy": 6}
    # 8 open: the last 4 of the 12 are kept for peers allowed to lease.
    assert flood[2].cmd("connect 3") == {"open": 3, "busy": 3}
    # A trainer (allowed, owning GPU 0's device node) still connects and leases.
    trainer = start_peer(
        daemon.socket,
        "--uid", str(NOBODY), "--gid", str(NOGROUP), "--device", str(daemon.dev_dir / "nvidia0"),
    )  # fmt: skip
    assert trainer.cmd("lease 0")["ok"]
    assert holder(daemon.status()[0]) == (trainer.pid, NOBODY)
    log = daemon.log()
    assert "(--max-connections-per-uid)" in log and "(--reserved-connections)" in log
    # Logged once per uid and 10 s, not once per refused connection (15 were refused).
    assert log.count("refused a connection from") == 3
    assert flood[0].cmd("open") == {"open": 4}  # the admitted ones stay (no idle timeout yet)


def test_idle_connections_and_partial_frames_time_out_a_lease_does_not(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon(
        "--simulate", "1", "--idle-timeout", "1", "--frame-timeout", "0.5",
        "--lease-timeout", "30",
    )  # fmt: skip
    daemon.own(0)
    leasing = GpudConnection(daemon.socket, timeout=20)
    leasing.call(lease=gpud_pb2.GpuRef(index=0))
    idle = raw(daemon.socket)
    half_header = raw(daemon.socket)
    half_header.sendall(b"\x00\x00")
    half_body = raw(daemon.socket)
    half_body.sendall(struct.pack(">I", 10) + b"abc")

    for s, expected in ((half_header, "--frame-timeout"), (half_body, "--frame-timeout")):
        reply = closing_reply(s)
        assert reply.error.code == gpud_pb2.TIMEOUT and expected in reply.error.message
    reply = closing_reply(idle)
    assert reply.error.code == gpud_pb2.TIMEOUT and "--idle-timeout" in reply.error.message
    # The leasing connection sent nothing for longer than the idle timeout: it keeps its lease.
    time.sleep(0.5)
    assert leasing.call(heartbeat=gpud_pb2.Empty()).HasField("heartbeat")
    assert holder(daemon.status()[0]) == (os.getpid(), 0)
    leasing.close()
    wait_for(lambda: daemon.status()[0]["holder"] is None, 10.0, "the lease to end")
    log = daemon.log()
    assert log.count("closed the connection of") >= 3


def test_a_trainer_leases_through_a_read_only_mount_of_the_socket_directory(
    start_daemon: Callable[..., Daemon], start_peer: Callable[..., PeerProcess], workdir: Path
) -> None:
    """An unprivileged trainer leases through a read-only mount of the socket's directory.

    What the kit's trainer pods get (a hostPath mounted ``readOnly``, which the kubelet makes a
    read-only bind mount): an unprivileged trainer leases through it, and even root there cannot
    replace the socket. The daemon's lock record is elsewhere (``--state``), out of the mount.
    """
    state = workdir / "state" / "gpud.state.json"
    daemon = start_daemon(
        "--simulate", "1", "--allow-uid", str(NOBODY), "--group", "nogroup", "--state", str(state)
    )  # fmt: skip
    view = workdir / "trainer-view"
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(workdir), str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.decode().strip()}")
    try:
        remount = ["mount", "-o", "remount,bind,ro", str(view)]
        assert subprocess.run(remount, capture_output=True).returncode == 0
        socket_there = str(view / "gpud.sock")
        with pytest.raises(OSError) as err:
            os.unlink(socket_there)
        assert err.value.strerror == "Read-only file system"
        trainer = start_peer(
            socket_there, "--uid", str(NOBODY), "--gid", str(NOGROUP),
            "--device", str(daemon.dev_dir / "nvidia0"),
        )  # fmt: skip
        assert trainer.cmd("lease 0")["ok"] and trainer.cmd("lock 1005")["ok"]
        assert daemon.status()[0]["holder"]["pid"] == trainer.pid
        assert state.exists() and not (workdir / "gpud.state.json").exists()
        trainer.kill()
    finally:
        subprocess.run(["umount", str(view)], capture_output=True)
