"""``perseus_gpud.procfs``: what the daemon reads about a peer process from ``/proc``.

Read from real processes (this one and children it starts); a process that is gone answers
``None`` or nothing, never an exception.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_gpud import procfs

POD = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
SYSTEMD_POD = POD.replace("-", "_")  # the systemd driver's spelling


@pytest.fixture
def child(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child of this process, with ``/dev/zero`` open and ``PERSEUS_JOB`` in its environment."""
    env = {**os.environ, "PERSEUS_JOB": "job-7"}
    code = "import sys, time; f = open('/dev/zero', 'rb'); print(flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # the file is open
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_process_is_read(child: subprocess.Popen[bytes]) -> None:
    assert procfs.parent(child.pid) == os.getpid()
    assert procfs.real_uid(child.pid) == os.getuid()
    start = procfs.start_time(child.pid)
    assert start is not None and start >= (procfs.start_time(os.getpid()) or 0)
    assert procfs.ancestors(child.pid)[:2] == [child.pid, os.getpid()]  # same uid: parents too
    assert "/dev/zero" in procfs.open_paths(child.pid)
    zero = os.stat("/dev/zero").st_rdev
    assert os.minor(zero) in procfs.open_nvidia_minors(child.pid, major=os.major(zero))
    assert procfs.open_nvidia_minors(child.pid) == set()  # no NVIDIA node open
    assert procfs.environ_value(child.pid, "PERSEUS_JOB") == "job-7"
    assert procfs.environ_value(child.pid, "PERSEUS_NO_SUCH_VARIABLE") is None


def test_a_process_that_is_gone_answers_nothing(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait()  # reaped: its /proc entry is gone
    pid = child.pid
    assert procfs.start_time(pid) is None and procfs.parent(pid) is None
    assert procfs.real_uid(pid) is None and procfs.ancestors(pid) == []
    assert procfs.open_paths(pid) == set() and procfs.open_nvidia_minors(pid) == set()
    assert procfs.pod_uid(pid) is None and procfs.environ_value(pid, "PERSEUS_JOB") is None
    assert procfs.start_time(0) is None and procfs.start_time(-1) is None


def test_pid_one_is_no_ones_ancestor() -> None:
    assert 1 not in procfs.ancestors(os.getpid())
    assert procfs.ancestors(os.getpid(), limit=1) == [os.getpid()]


@pytest.mark.parametrize(
    ("path", "pod"),
    [
        (f"/kubepods/pod{POD}/abc", POD),  # cgroupfs driver, guaranteed QoS
        (f"/kubepods/burstable/pod{POD}", POD),
        (
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_POD}.slice/x",
            POD,
        ),
        (f"/kubepods.slice/kubepods-pod{SYSTEMD_POD}.slice", POD),
        (f"/../pod{POD}/c", POD),  # seen from another cgroup namespace, inside kubepods
        (f"/user.slice/user-1000.slice/pod{POD}", None),  # a delegated subtree's look-alike
        (f"/kubepods/gold/pod{POD}", None),  # no such QoS level
        (f"/kubepods/pod{POD[:-1]}", None),  # not a UID
        ("/", None),
        ("", None),
    ],
)
def test_only_the_kubelets_pod_cgroups_name_a_pod(path: str, pod: str | None) -> None:
    assert procfs.pod_in_cgroup(path) == pod


def test_a_process_in_two_pods_is_in_none(tmp_path: Path) -> None:
    """``proc`` pointed at a made-up tree: what this machine cannot produce (a pod's cgroup)."""
    other = "1" * 8 + "-2222-3333-4444-" + "5" * 12
    (tmp_path / "42").mkdir()
    cgroup = tmp_path / "42" / "cgroup"
    cgroup.write_text(f"0::/kubepods/pod{POD}/c\n1:cpu:/kubepods/pod{POD}/c\n")
    assert procfs.pod_uid(42, proc=str(tmp_path)) == POD
    cgroup.write_text(f"0::/kubepods/pod{POD}/c\n1:cpu:/kubepods/pod{other}/c\n")
    assert procfs.pod_uid(42, proc=str(tmp_path)) is None
    cgroup.write_text("0::/user.slice\n")
    assert procfs.pod_uid(42, proc=str(tmp_path)) is None
