"""Ownership: gpud leases a GPU only to a process the node gave it to.

Tested with real processes against a real ``perseus gpud --simulate``: simulated device nodes opened
by the peer (or a parent of the same uid); a peer sees only the GPUs it leases or owns. Also: a
lease dies with the process that took it (a real fork). Malformed state files are
``test_cli_daemon.py``'s. The Kubernetes route (the kubelet's pod-resources API) is
``test_ownership_kubelet.py``.
"""

from __future__ import annotations

import filecmp
import os
import signal
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import gpud_harness
import pytest
from gpud_harness import NOBODY, NOGROUP, REPO, Daemon, PeerProcess, wait_for

from perseus_client.errors import GpudRefusedError
from perseus_client.gpu.daemon_connection import GpudConnection
from perseus_common.proto import gpud_pb2
from perseus_gpud import procfs
from perseus_gpud.simnvml import simulated_uuid

workdir = gpud_harness.workdir
start_daemon = gpud_harness.start_daemon
start_peer = gpud_harness.start_peer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")

CGROUP_ROOT = Path("/sys/fs/cgroup/systemd")  # a cgroup v1 hierarchy this machine lets us write


def test_a_lease_needs_the_gpus_own_device_node(
    start_daemon: Callable[..., Daemon], start_peer: Callable[..., PeerProcess]
) -> None:
    daemon = start_daemon("--simulate", "2", "--allow-uid", str(NOBODY), "--group", "nogroup")
    creds = ("--uid", str(NOBODY), "--gid", str(NOGROUP))
    stranger = start_peer(daemon.socket, *creds)
    refused = stranger.cmd("lease 0")
    assert refused["code"] == "NOT_OWNER"
    assert (
        "nvidia<minor> open" in refused["message"] and f"pid {stranger.pid}" in refused["message"]
    )
    # GPU 0's node opened does not make GPU 1 its own; by UUID or index alike.
    peer = start_peer(
        daemon.socket,
        *creds,
        "--device",
        str(daemon.dev_dir / "nvidia0"),
        env={"SLURM_JOB_ID": "4242"},  # a Slurm job's trainer: status names the job
    )
    assert peer.cmd(f"lease {simulated_uuid(1)}")["code"] == "NOT_OWNER"
    assert peer.cmd("lease 1")["code"] == "NOT_OWNER"
    granted = peer.cmd(f"lease {simulated_uuid(0)}")
    assert granted == {"ok": True, "uuid": simulated_uuid(0), "index": 0}
    row = daemon.status()[0]
    assert (row["holder"]["pid"], row["holder"]["owned_by"]) == (peer.pid, "device-node")
    assert row["holder"]["slurm_job"] == "4242"
    # Who holds a GPU is told only to a peer that owns it: the stranger learns nothing.
    told_stranger = stranger.cmd("lease 0")
    assert told_stranger["code"] == "NOT_OWNER" and "4242" not in told_stranger["message"]
    rival = start_peer(daemon.socket, *creds, "--device", str(daemon.dev_dir / "nvidia0"))
    held = rival.cmd("lease 0")
    assert held["code"] == "LEASE_HELD" and "; Slurm job 4242" in held["message"]
    log = daemon.log()
    assert log.count("refused lease from") == 5 and log.count("): leased by") == 1


def test_a_parents_device_node_counts_only_for_the_same_uid(
    start_daemon: Callable[..., Daemon], start_peer: Callable[..., PeerProcess]
) -> None:
    daemon = start_daemon("--simulate", "2", "--allow-uid", str(NOBODY), "--group", "nogroup")
    daemon.own(1)  # this test process (root) has GPU 1's node open; its children do not
    other_uid = start_peer(daemon.socket, "--uid", str(NOBODY), "--gid", str(NOGROUP))
    assert other_uid.cmd("lease 1")["code"] == "NOT_OWNER"
    child = start_peer(daemon.socket)  # root, like its parent: a launcher's worker
    assert child.cmd("lease 1")["ok"]
    assert daemon.status()[1]["holder"]["pid"] == child.pid


def test_a_peer_sees_only_the_gpus_it_leases_or_owns(
    start_daemon: Callable[..., Daemon], start_peer: Callable[..., PeerProcess]
) -> None:
    """Status and samples: root and the admin group see every GPU.

    Any other peer, allowed or not, only the GPUs it leases or owns (and no other holder).
    """
    daemon = start_daemon(
        "--simulate", "3", "--allow-uid", str(NOBODY), "--admin-gid", "1234", "--group", "nogroup"
    )  # fmt: skip
    creds = ("--uid", str(NOBODY), "--gid", str(NOGROUP))
    holder = start_peer(daemon.socket, *creds, "--device", str(daemon.dev_dir / "nvidia2"))
    assert holder.cmd("lease 2")["ok"]
    owner = start_peer(daemon.socket, *creds, "--device", str(daemon.dev_dir / "nvidia0"))
    assert owner.cmd("status") == {"gpus": [0], "holders": []}  # owns 0; 2 is another's
    assert owner.cmd("sample 0")["ok"]
    refused = owner.cmd("sample 2")
    assert refused["code"] == "NOT_OWNER" and "nvidia<minor>" in refused["message"]
    assert holder.cmd("status") == {"gpus": [2], "holders": [holder.pid]}
    stranger = start_peer(daemon.socket, *creds)
    assert stranger.cmd("status") == {"gpus": [], "holders": []}
    assert stranger.cmd("sample 1")["code"] == "NOT_OWNER"
    # Root (the operator's `perseus gpud status`) and a member of --admin-gid see everything.
    assert [r["index"] for r in daemon.status()] == [0, 1, 2]
    admin = start_peer(daemon.socket, *creds, "--groups", "1234")
    assert admin.cmd("status") == {"gpus": [0, 1, 2], "holders": [holder.pid]}
    assert admin.cmd("sample 2")["ok"]
    # A change by a connection without the lease is refused without naming who holds it.
    with GpudConnection(daemon.socket) as conn, pytest.raises(GpudRefusedError) as err:
        conn.call(set_clock=gpud_pb2.SetClock(index=2, mhz=1005))
    assert err.value.code == "NOT_LEASED" and str(holder.pid) not in str(err.value)


def test_a_lease_dies_with_the_process_that_took_it_not_with_a_forked_child(
    start_daemon: Callable[..., Daemon], start_peer: Callable[..., PeerProcess]
) -> None:
    # A lease timeout no stall of the child's heartbeat on a loaded machine reaches (it was 2 s,
    # and a lease that timed out was logged as silent, not as its process's exit): the lease
    # can only end here because its process exited.
    daemon = start_daemon("--simulate", "1", "--lease-timeout", "60")
    peer = start_peer(daemon.socket, "--device", str(daemon.dev_dir / "nvidia0"))
    assert peer.cmd("lease 0")["ok"] and peer.cmd("lock 1005")["ok"]
    child = peer.cmd("fork")["child"]
    try:
        assert daemon.status()[0]["locked_mhz"] == 1005
        assert daemon.status()[0]["holder"]["pid"] == peer.pid
        peer.send("exit")
        peer.proc.wait(timeout=10)
        # The child still holds the socket and heartbeats; the lease is gone all the same.
        # (The lease ends, then the GPU is reset: a status between the two may show either.)
        wait_for(
            lambda: (r := daemon.status()[0])["holder"] is None and r["locked_mhz"] is None,
            60.0,
            "the lease to end and the GPU to be reset",
        )
        assert procfs.start_time(child) is not None  # the child is alive
        assert f"its process, pid {peer.pid}, exited" in daemon.log()
    finally:
        os.kill(child, signal.SIGKILL)  # not this process's child: init reaps it


def test_the_committed_pod_resources_stubs_are_current() -> None:
    from grpc_tools import protoc

    src = REPO / "gpud"
    name = "perseus_gpud/podresources"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc", f"-I{src}", f"--python_out={tmp}", f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}", f"{src}/{name}.proto",
        ]  # fmt: skip
        assert protoc.main(args) == 0
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert filecmp.cmp(f"{tmp}/{name}{suffix}", src / f"{name}{suffix}", shallow=False), (
                f"{name}{suffix} is stale: regenerate it (see podresources.proto)"
            )


def test_real_device_nodes_are_matched_by_device_number_through_proc(
    start_peer: Callable[..., PeerProcess], workdir: Path
) -> None:
    """The path gpud takes on a GPU node.

    ``/proc/PID/fd`` → ``stat`` → a character device's major and minor, through a parent of the
    same uid too. No GPU here, so the major is that of ``/dev/zero`` and ``/dev/full`` (1)
    instead of NVIDIA's 195; a name other than ``/dev/...`` (a container's own device node)
    matches all the same.
    """
    from perseus_gpud.ownership import DeviceNodeOwnership

    alias = workdir / "renamed-zero"
    zero = os.stat("/dev/zero").st_rdev
    os.mknod(alias, 0o666 | stat.S_IFCHR, zero)
    peer = start_peer(str(workdir / "no.sock"), "--device", str(alias))  # opens it, then waits
    wait_for(lambda: procfs.open_nvidia_minors(peer.pid, major=1), 10.0, "the peer's open node")
    assert procfs.open_nvidia_minors(peer.pid, major=1) == {os.minor(zero)}
    assert procfs.open_nvidia_minors(peer.pid) == set()  # no NVIDIA node: nothing
    check = DeviceNodeOwnership(major=1)
    assert check.owns(peer.pid, os.minor(zero))
    assert not DeviceNodeOwnership().owns(peer.pid, os.minor(zero))  # not NVIDIA's major
    full = os.minor(os.stat("/dev/full").st_rdev)
    assert not check.owns(peer.pid, full)
    with open("/dev/full", "rb"):  # now this process, the peer's parent (same uid), has it
        assert check.owns(peer.pid, full)
