"""Ownership on a node with a kubelet.

A real ``perseus gpud --simulate`` asks a real gRPC server implementing ``v1.PodResourcesLister`` on
a Unix socket (the kubelet's stand-in), and its peers are real processes placed in real cgroups
(cgroup v1, ``name=systemd``) at the paths the kubelet gives pods, at the hierarchy's root as the
kubelet makes them.

What is checked: a process in a pod owns only the GPUs the kubelet assigned to its pod (another
pod's device node held open proves nothing); a host process with a device node open owns only a
GPU the kubelet gave no pod; a cgroup outside the kubelet's hierarchy whose path
names a pod is no pod; the holder's labels come from the peer; the kubelet's answer is cached and
asked one call at a time on a thread of its own, so a device-node owner's lease never waits on a
slow kubelet (its timing is measured in ``benchmarks/gpud_kubelet.py``, not here; its smoke run is
``tests/benchmarks/test_gpud_kubelet_smoke.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import gpud_harness
import grpc
import pytest
from gpud_harness import Daemon, PeerProcess, wait_for

from perseus_gpud import podresources_pb2, podresources_pb2_grpc, procfs
from perseus_gpud.simnvml import simulated_uuid

workdir = gpud_harness.workdir
start_daemon = gpud_harness.start_daemon
start_peer = gpud_harness.start_peer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")

CGROUP_ROOT = Path("/sys/fs/cgroup/systemd")  # a cgroup v1 hierarchy this machine lets us write


class Kubelet(podresources_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's pod-resources API: ``pods`` is ``(namespace, name, container, [GPU UUIDs])``.

    While ``gate`` is clear, ``List`` waits on it (a slow kubelet).
    """

    def __init__(self, pods: list[tuple[str, str, str, list[str]]]) -> None:
        self.pods = pods
        self.calls = 0
        self.answered = 0
        self.gate = threading.Event()
        self.gate.set()

    def List(  # noqa: N802 - the API's name
        self, request: podresources_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.ListPodResourcesResponse:
        self.calls += 1
        self.gate.wait(60)
        reply = podresources_pb2.ListPodResourcesResponse()
        for namespace, name, container, gpus in self.pods:
            pod = reply.pod_resources.add(name=name, namespace=namespace)
            c = pod.containers.add(name=container)
            c.devices.add(resource_name="nvidia.com/cpu-not-gpu", device_ids=["x"])
            c.devices.add(resource_name="nvidia.com/gpu", device_ids=gpus)
        self.answered += 1
        return reply


@contextlib.contextmanager
def serve_kubelet(kubelet: Kubelet, sock: Path) -> Iterator[None]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        yield
    finally:
        kubelet.gate.set()
        server.stop(None)


@pytest.fixture
def cgroups() -> Iterator[Callable[[str, int], None]]:
    """Put a process into the cgroup at a path from the hierarchy's root.

    What this fixture created is removed afterwards; a shared parent such as ``kubepods`` only
    when empty.
    """
    probe = CGROUP_ROOT / f"perseus-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        pytest.skip(f"cannot create cgroups here: {exc}")
    created: list[Path] = []
    moved: list[int] = []

    def place(path: str, pid: int) -> None:
        d = CGROUP_ROOT
        for part in path.split("/"):
            d = d / part
            if not d.exists():
                d.mkdir(exist_ok=True)
                created.append(d)
        (d / "cgroup.procs").write_text(str(pid))
        moved.append(pid)

    yield place
    for pid in moved:
        with contextlib.suppress(OSError):  # exited
            (CGROUP_ROOT / "cgroup.procs").write_text(str(pid))
    for d in sorted(created, key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):  # another test's cgroup below a shared parent
            d.rmdir()


def pod_log_dirs(root: Path, *pods: tuple[str, str, str]) -> Path:
    for namespace, name, uid in pods:
        (root / f"{namespace}_{name}_{uid}" / "trainer").mkdir(parents=True)
    return root


def test_pods_own_only_what_the_kubelet_assigned_them(
    start_daemon: Callable[..., Daemon],
    start_peer: Callable[..., PeerProcess],
    workdir: Path,
    cgroups: Callable[[str, int], None],
) -> None:
    pod_a, pod_b = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    logs = pod_log_dirs(
        workdir / "pods", ("team-a", "train-0", pod_a), ("team-b", "train-0", pod_b)
    )
    kubelet = Kubelet(
        [
            ("team-a", "train-0", "trainer", [simulated_uuid(1)]),
            ("team-b", "train-0", "trainer", [simulated_uuid(0)]),
        ]
    )
    sock = workdir / "kubelet.sock"
    with serve_kubelet(kubelet, sock):
        textfile = workdir / "gpud.prom"
        # --ownership auto (the default): device-node, plus pod-resources as the socket exists.
        daemon = start_daemon(
            "--simulate", "3", "--kubelet-socket", str(sock), "--pod-logs-dir", str(logs),
            "--kubelet-cache", "0.2",
            "--metrics-textfile", str(textfile), "--metrics-interval", "0.2",
        )  # fmt: skip
        dev = daemon.dev_dir
        # Pod team-a's trainer (cgroupfs driver's path) also holds GPU 0's device node open:
        # GPU 0 is team-b's, and a device node is no proof for a process in a pod.
        a = start_peer(daemon.socket, "--device", str(dev / "nvidia0"))
        cgroups(f"kubepods/burstable/pod{pod_a}/0123abcd", a.pid)
        # Pod team-b's (systemd driver's slice names).
        b = start_peer(daemon.socket)
        slice_b = f"kubepods-burstable-pod{pod_b.replace('-', '_')}.slice"
        cgroups(f"kubepods.slice/kubepods-burstable.slice/{slice_b}/cri-containerd-1.scope", b.pid)
        # A cgroup of its own whose path names pod team-a: no pod (and no device node).
        impostor = start_peer(daemon.socket)
        cgroups(f"perseus-test-{os.getpid()}/kubepods/burstable/pod{pod_a}/x", impostor.pid)
        assert (procfs.pod_uid(a.pid), procfs.pod_uid(b.pid)) == (pod_a, pod_b)
        assert procfs.pod_uid(impostor.pid) is None

        hijack = a.cmd(f"lease {simulated_uuid(0)}")
        assert hijack["code"] == "NOT_OWNER"
        assert (
            "did not assign it to its pod team-a/train-0 (it is another pod's)"
            in (hijack["message"])
        )
        assert impostor.cmd("lease 1")["code"] == "NOT_OWNER"
        assert impostor.cmd(f"lease {simulated_uuid(1)}")["code"] == "NOT_OWNER"
        assert a.cmd(f"lease {simulated_uuid(1)} 0123456789abcdef team-a")["ok"]
        assert b.cmd("lease 0")["ok"]
        rows = daemon.status()
        assert rows[1]["holder"] | {"pid": 0} == {
            "pid": 0, "uid": 0, "pod": "train-0", "namespace": "team-a", "slurm_job": "",
            "owned_by": "pod-resources", "job": "0123456789abcdef", "tenant": "team-a",
        }  # fmt: skip
        assert rows[0]["holder"]["namespace"] == "team-b"
        # A host process (in no pod) with a device node open: not a GPU the kubelet gave a pod
        # (GPU 1 is team-a's), but one it gave no pod (GPU 2).
        host = start_peer(daemon.socket, "--device", str(dev / "nvidia1"))
        refused = host.cmd("lease 1")
        assert refused["code"] == "NOT_OWNER" and "assigned it to a pod" in refused["message"]
        assert "team-a" not in refused["message"]
        free = start_peer(daemon.socket, "--device", str(dev / "nvidia2"))
        assert free.cmd("lease 2")["ok"]
        assert daemon.status()[2]["holder"]["owned_by"] == "device-node"
        # The holder's identity is one info series per GPU; the GPU's own series keep their
        # labels whoever holds it.
        info = (
            f'perseus_gpud_lease_holder_info{{uuid="{simulated_uuid(1)}",index="1",'
            f'pid="{a.pid}",uid="0",owned_by="pod-resources",pod="train-0",namespace="team-a",'
            'perseus_job="0123456789abcdef",tenant="team-a"} 1.0'
        )
        leased = f'perseus_gpud_leased{{uuid="{simulated_uuid(1)}",index="1"}} 1.0'
        wait_for(lambda: info in (t := textfile.read_text()) and leased in t, 10.0, "metrics")
        assert "pod-resources: cannot list" not in daemon.log()


def test_a_device_node_owner_in_no_pod_is_not_judged_by_the_kubelet(
    start_daemon: Callable[..., Daemon],
    start_peer: Callable[..., PeerProcess],
    workdir: Path,
    cgroups: Callable[[str, int], None],
) -> None:
    """A slow kubelet: pod peers wait for its one ``List`` call.

    A host process that holds its GPU's device node leases meanwhile, without a call of its own,
    and its labels name no pod (they come from the peer, never from the GPU's assignment).
    """
    pods = [(f"team-{i}", "train-0", str(uuidlib.uuid4())) for i in range(4)]
    logs = pod_log_dirs(workdir / "pods", *pods)
    kubelet = Kubelet(
        [(ns, name, "trainer", [simulated_uuid(i)]) for i, (ns, name, _) in enumerate(pods)]
    )
    sock = workdir / "kubelet.sock"
    with serve_kubelet(kubelet, sock):
        daemon = start_daemon(
            "--simulate", "5", "--kubelet-socket", str(sock), "--pod-logs-dir", str(logs),
            "--kubelet-timeout", "60", "--kubelet-cache", "600",
        )  # fmt: skip
        peers = []
        for i, (_, _, uid) in enumerate(pods):
            peer = start_peer(daemon.socket)
            cgroups(f"kubepods/besteffort/pod{uid}/c{i}", peer.pid)
            peers.append(peer)
        kubelet.gate.clear()  # the kubelet stops answering
        for i, peer in enumerate(peers):
            peer.send(f"lease {i}")
        wait_for(lambda: kubelet.calls == 1, 10.0, "the daemon's List call")
        host = start_peer(daemon.socket, "--device", str(daemon.dev_dir / "nvidia4"))
        assert host.cmd("lease 4") == {"ok": True, "uuid": simulated_uuid(4), "index": 4}
        assert (kubelet.calls, kubelet.answered) == (1, 0)  # it leased while List was pending
        holder = daemon.status()[4]["holder"]
        assert (holder["owned_by"], holder["pod"], holder["namespace"]) == ("device-node", "", "")
        kubelet.gate.set()
        for peer in peers:
            assert peer.read()["ok"]
        assert kubelet.calls == 1  # one call answered every pod peer that waited on it
        again = start_peer(daemon.socket)
        cgroups(f"kubepods/besteffort/pod{pods[0][2]}/again", again.pid)
        assert again.cmd("lease 0")["code"] == "LEASE_HELD"
        assert kubelet.calls == 1  # the cached answer (--kubelet-cache 600)
