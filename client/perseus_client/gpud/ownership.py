"""Which GPUs a peer owns: the daemon leases a GPU only to a process the node gave it to.

Two mechanisms, each built from what the node already knows (``--ownership``):

``device-node``
    The peer, or one of its parents with the same uid (pid 1 excluded), has the GPU's device
    node open: ``/proc/PID/fd`` → a character device of major 195 whose minor is the GPU's
    minor number (NVML's ``nvmlDeviceGetMinorNumber``). CUDA opens ``/dev/nvidia<N>`` when it
    initialises a device, and a container, a Slurm job's cgroup or a plain host lets a process
    open only the nodes it was given, so this covers Slurm, plain hosts and Kubernetes (with
    ``hostPID``). With ``--simulate`` the device nodes are files in a directory
    (``--simulate-dev-dir``), matched by path.
``pod-resources``
    Kubernetes: the kubelet's pod-resources API (gRPC ``v1.PodResourcesLister/List`` on its Unix
    socket) says which pod and container each GPU (by UUID) is assigned to; the peer's pod is
    the one whose UID is in its cgroup path (``/proc/PID/cgroup``), named by the kubelet's log
    directory ``/var/log/pods/<namespace>_<name>_<uid>`` (the pod-resources API carries names,
    not UIDs). The peer owns the GPU when the two pods are the same.

A lease is granted when any configured mechanism says yes (``none``: every allowed peer owns
every GPU, the behaviour of single-tenant nodes). Pod names, namespaces (from the kubelet) and
the Slurm job id (``SLURM_JOB_ID`` of the peer's environment, a label only: a process chooses
its environment) label the holder in status and metrics.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from perseus_client.gpud import procfs

__all__ = [
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_POD_LOGS",
    "Owner",
    "DeviceNodeOwnership",
    "PodResourcesOwnership",
    "Ownership",
]

log = logging.getLogger("perseus_client.gpud")

#: The kubelet's pod-resources socket.
DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: The kubelet's pod log directories, ``<namespace>_<name>_<uid>``.
DEFAULT_POD_LOGS = "/var/log/pods"
#: The device-plugin resource names that are GPUs.
GPU_RESOURCES = ("nvidia.com/gpu",)


@dataclass(frozen=True)
class Owner:
    """Why a peer owns a GPU, and what names its holder."""

    how: str  # "device-node", "pod-resources" or "unchecked"
    pod: str = ""
    namespace: str = ""
    slurm_job: str = ""


class DeviceNodeOwnership:
    """The ``device-node`` mechanism (see the module docstring).

    Args:
        dev_dir: ``None`` for real device nodes (matched by device number); a directory whose
            files ``nvidia<minor>`` stand in for them (``--simulate``), matched by path.
        proc: the procfs mount.
        major: the device nodes' major number (NVIDIA's, 195; a test without a GPU uses another
            character device's).
    """

    name = "device-node"

    def __init__(
        self, dev_dir: str | None = None, proc: str = "/proc", major: int = procfs.NVIDIA_MAJOR
    ) -> None:
        self.dev_dir = None if dev_dir is None else os.path.realpath(dev_dir)
        self.proc = proc
        self.major = major

    def owns(self, pid: int, minor: int) -> bool:
        for p in procfs.ancestors(pid, self.proc):
            if self.dev_dir is None:
                if minor in procfs.open_nvidia_minors(p, self.proc, self.major):
                    return True
            elif os.path.join(self.dev_dir, f"nvidia{minor}") in procfs.open_paths(p, self.proc):
                return True
        return False

    def describe(self) -> str:
        node = "/dev/nvidia<minor>" if self.dev_dir is None else f"{self.dev_dir}/nvidia<minor>"
        return f"its process (or a parent of the same uid) has {node} open"


class PodResourcesOwnership:
    """The ``pod-resources`` mechanism (see the module docstring).

    Args:
        socket: the kubelet's pod-resources Unix socket.
        pod_logs: the kubelet's pod log directory (names a pod UID's namespace and name).
        proc: the procfs mount.
        timeout: seconds a ``List`` call may take.
    """

    name = "pod-resources"

    def __init__(
        self,
        socket: str = DEFAULT_KUBELET_SOCKET,
        pod_logs: str = DEFAULT_POD_LOGS,
        proc: str = "/proc",
        timeout: float = 2.0,
    ) -> None:
        self.socket = socket
        self.pod_logs = pod_logs
        self.proc = proc
        self.timeout = timeout

    def assignments(self) -> dict[str, tuple[str, str, str]]:
        """GPU UUID → ``(namespace, pod, container)``, from the kubelet (blocking)."""
        import grpc

        from perseus_client.gpud import podresources_pb2, podresources_pb2_grpc

        out: dict[str, tuple[str, str, str]] = {}
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            reply = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        for pod in reply.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if devices.resource_name in GPU_RESOURCES:
                        for device_id in devices.device_ids:
                            out[device_id] = (pod.namespace, pod.name, container.name)
        return out

    def pod_of(self, pid: int) -> tuple[str, str] | None:
        """``(namespace, name)`` of the pod whose cgroup holds ``pid`` (``None``: not in a pod,
        or the kubelet has no log directory for it)."""
        uid = procfs.pod_uid(pid, self.proc)
        if uid is None:
            return None
        try:
            entries = os.listdir(self.pod_logs)
        except OSError:
            return None
        for entry in entries:
            parts = entry.split("_")
            if len(parts) == 3 and parts[2] == uid:
                return parts[0], parts[1]
        return None

    def owner(self, pid: int, uuid: str) -> Owner | None:
        """The pod that owns GPU ``uuid`` when the peer ``pid`` runs in it, else ``None``."""
        pod = self.pod_of(pid)
        if pod is None:
            return None
        try:
            assigned = self.assignments().get(uuid)
        except Exception as exc:  # noqa: BLE001 - the kubelet is down: no proof, refuse
            log.error("pod-resources: cannot list the kubelet's assignments: %s", exc)
            return None
        if assigned is not None and assigned[:2] == pod:
            return Owner(self.name, pod=pod[1], namespace=pod[0])
        return None

    def describe(self) -> str:
        return f"the kubelet ({self.socket}) assigned the GPU to its pod"


class Ownership:
    """The configured mechanisms (empty: no check, every allowed peer owns every GPU)."""

    def __init__(
        self,
        device_node: DeviceNodeOwnership | None = None,
        pod_resources: PodResourcesOwnership | None = None,
        proc: str = "/proc",
    ) -> None:
        self.device_node = device_node
        self.pod_resources = pod_resources
        self.proc = proc

    @property
    def checked(self) -> bool:
        return self.device_node is not None or self.pod_resources is not None

    def describe(self) -> str:
        parts = [m.describe() for m in (self.device_node, self.pod_resources) if m is not None]
        return " or ".join(parts) if parts else "unchecked (--ownership none)"

    def check(self, pid: int, uuid: str, minor: int) -> Owner | None:
        """Whether process ``pid`` owns the GPU (blocking: reads /proc, may call the kubelet)."""
        slurm = (procfs.environ_value(pid, "SLURM_JOB_ID", self.proc) or "") if pid > 0 else ""
        if not self.checked:
            return Owner("unchecked", slurm_job=slurm, **self._pod_labels(pid, uuid))
        if self.pod_resources is not None:
            owner = self.pod_resources.owner(pid, uuid)
            if owner is not None:
                return Owner(owner.how, owner.pod, owner.namespace, slurm)
        if self.device_node is not None and self.device_node.owns(pid, minor):
            return Owner(self.device_node.name, slurm_job=slurm, **self._pod_labels(pid, uuid))
        return None

    def _pod_labels(self, pid: int, uuid: str) -> dict[str, str]:
        if self.pod_resources is None or pid <= 0:
            return {}
        try:
            assigned = self.pod_resources.assignments().get(uuid)
        except Exception:  # noqa: BLE001 - labels only
            return {}
        return {} if assigned is None else {"namespace": assigned[0], "pod": assigned[1]}
