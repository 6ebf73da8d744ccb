"""Which GPUs a peer owns: the daemon leases a GPU only to a process the node gave it to.

Two mechanisms, each built from what the node already knows (``--ownership``):

``device-node``
    The peer, or one of its parents with the same uid (pid 1 excluded), has the GPU's device
    node open: ``/proc/PID/fd`` → a character device of major 195 whose minor is the GPU's
    minor number (NVML's ``nvmlDeviceGetMinorNumber``). CUDA opens ``/dev/nvidia<N>`` when it
    initialises a device, and a container, a Slurm job's cgroup or a plain host lets a process
    open only the nodes it was given, so this covers Slurm and plain hosts. With ``--simulate``
    the device nodes are files in a directory (``--simulate-dev-dir``), matched by path.
``pod-resources``
    Kubernetes: the kubelet's pod-resources API (gRPC ``v1.PodResourcesLister/List`` on its Unix
    socket) says which pod and container each GPU (by UUID) is assigned to; the peer's pod is
    the one whose UID is in its **own** cgroup path, and only in the kubelet's pod hierarchy
    (:func:`~perseus_gpud.procfs.pod_in_cgroup`), named by the kubelet's log directory
    ``/var/log/pods/<namespace>_<name>_<uid>`` (the pod-resources API carries names, not UIDs).

**With a kubelet, a process in a pod is judged by the kubelet alone**: it owns a GPU only when
the kubelet assigned that GPU to its pod; a device node it holds open proves nothing (on a node
whose ``/dev/nvidia*`` are 0666, a pod that can open another pod's node would otherwise take its
GPU). A process in no pod (a host process) is judged by its device nodes, and refused a GPU
that the kubelet's last answer assigns to a pod; it never waits for the kubelet (the answer it
is judged by may be a few seconds old, or none yet just after the daemon started). The kubelet's
answer is cached for ``ttl`` seconds and asked on a thread of its own, one
call at a time for all askers (:class:`KubeletAssignments`); the ``/proc`` reads run on another
pool, so a slow kubelet never delays a device-node owner.

Labels name the holder from what the **peer** is (its cgroup's pod, its ``SLURM_JOB_ID``, a label
only: a process chooses its environment), never from whom the GPU is assigned to. ``none``:
every allowed peer owns every GPU (single-tenant nodes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from perseus_gpud import procfs

__all__ = [
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_POD_LOGS",
    "Owner",
    "Denied",
    "DeviceNodeOwnership",
    "KubeletAssignments",
    "PodResourcesOwnership",
    "Ownership",
]

log = logging.getLogger("perseus_gpud")

#: The kubelet's pod-resources socket.
DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: The kubelet's pod log directories, ``<namespace>_<name>_<uid>``.
DEFAULT_POD_LOGS = "/var/log/pods"
#: The device-plugin resource names that are GPUs.
GPU_RESOURCES = ("nvidia.com/gpu",)

_T = TypeVar("_T")

#: GPU UUID → ``(namespace, pod, container)``.
Assignments = dict[str, tuple[str, str, str]]


@dataclass(frozen=True)
class Owner:
    """Why a peer owns a GPU, and what names its holder (all from the peer itself)."""

    how: str  # "device-node", "pod-resources" or "unchecked"
    pod: str = ""
    namespace: str = ""
    slurm_job: str = ""
    job: str = ""  # the Perseus job and tenant the client named at lease time (labels only)
    tenant: str = ""


@dataclass(frozen=True)
class Denied:
    """Why a peer does not own a GPU, in words for the refusal."""

    reason: str


@dataclass(frozen=True)
class _Facts:
    """What ``/proc`` says about a peer: its Slurm job, its pod UID and the pod's name."""

    slurm_job: str = ""
    pod_uid: str | None = None
    pod: tuple[str, str] | None = None  # (namespace, name)


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
        """Whether ``pid`` or a parent of the same uid has the device node of ``minor`` open."""
        for p in procfs.ancestors(pid, self.proc):
            if self.dev_dir is None:
                if minor in procfs.open_nvidia_minors(p, self.proc, self.major):
                    return True
            elif os.path.join(self.dev_dir, f"nvidia{minor}") in procfs.open_paths(p, self.proc):
                return True
        return False

    def describe(self) -> str:
        """The rule this check applies, for refusal messages."""
        node = "/dev/nvidia<minor>" if self.dev_dir is None else f"{self.dev_dir}/nvidia<minor>"
        return f"its process (or a parent of the same uid) has {node} open"


def list_assignments(socket: str, timeout: float) -> Assignments:
    """GPU UUID → ``(namespace, pod, container)``, from the kubelet (blocking)."""
    import grpc

    from perseus_gpud import podresources_pb2, podresources_pb2_grpc

    out: Assignments = {}
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        reply = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=timeout)
    for pod in reply.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name in GPU_RESOURCES:
                    for device_id in devices.device_ids:
                        out[device_id] = (pod.namespace, pod.name, container.name)
    return out


class KubeletAssignments:
    """The kubelet's GPU assignments, cached for ``ttl`` seconds.

    They are asked one call at a time on a thread of their own (all askers meanwhile await that
    one call). A failure is cached too, so a kubelet that is down is not asked once per lease.

    Used from one event loop (the daemon's). ``calls`` counts the ``List`` calls made.
    """

    def __init__(self, socket: str, timeout: float = 2.0, ttl: float = 2.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self.ttl = ttl
        self.calls = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpud-kubelet")
        self._cached: tuple[float, Assignments | BaseException] | None = None
        self._last: Assignments | None = None  # the last answer, of any age
        self._inflight: asyncio.Future[Assignments] | None = None

    def _list(self) -> Assignments:
        self.calls += 1
        return list_assignments(self.socket, self.timeout)

    async def get(self) -> Assignments:
        """The assignments (raises what the last call raised while that is cached)."""
        cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < self.ttl:
            if isinstance(cached[1], BaseException):
                raise cached[1]
            return cached[1]
        return await asyncio.shield(self._ask())

    def _ask(self) -> asyncio.Future[Assignments]:
        if self._inflight is None:
            inflight = asyncio.get_running_loop().run_in_executor(self._pool, self._list)
            inflight.add_done_callback(self._done)
            self._inflight = inflight
        return self._inflight

    def peek(self) -> Assignments | None:
        """The last answer the kubelet gave, of any age, without waiting (``None``: none yet).

        When it is older than ``ttl``, a new call starts in the background.
        """
        cached = self._cached
        if cached is None or time.monotonic() - cached[0] >= self.ttl:
            self._ask()
        return self._last

    def _done(self, future: asyncio.Future[Assignments]) -> None:
        self._inflight = None
        if future.cancelled():
            return
        error = future.exception()
        self._cached = (time.monotonic(), error if error is not None else future.result())
        if error is None:
            self._last = future.result()

    def close(self) -> None:
        """Stop the thread that asks the kubelet; a call under way is not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class PodResourcesOwnership:
    """The ``pod-resources`` mechanism (see the module docstring).

    Args:
        socket: the kubelet's pod-resources Unix socket.
        pod_logs: the kubelet's pod log directory (names a pod UID's namespace and name).
        proc: the procfs mount.
        timeout: seconds a ``List`` call may take.
        ttl: seconds a ``List`` answer is used for.
    """

    name = "pod-resources"

    def __init__(
        self,
        socket: str = DEFAULT_KUBELET_SOCKET,
        pod_logs: str = DEFAULT_POD_LOGS,
        proc: str = "/proc",
        timeout: float = 2.0,
        ttl: float = 2.0,
    ) -> None:
        self.socket = socket
        self.pod_logs = pod_logs
        self.proc = proc
        self.kubelet = KubeletAssignments(socket, timeout, ttl)

    async def owner(self, facts: _Facts, uuid: str) -> Owner | Denied:
        """Whether the kubelet assigned GPU ``uuid`` to the peer's pod (``facts.pod``)."""
        if facts.pod is None:
            return Denied(
                f"its cgroup names pod {facts.pod_uid}, which has no log directory in "
                f"{self.pod_logs} (not a pod of this kubelet)"
            )
        try:
            assigned = (await self.kubelet.get()).get(uuid)
        except Exception as exc:  # noqa: BLE001 - the kubelet is down: no proof, refuse
            log.error("pod-resources: cannot list the kubelet's assignments: %s", exc)
            return Denied(f"the kubelet ({self.socket}) did not answer: {exc}")
        namespace, name = facts.pod
        if assigned is not None and assigned[:2] == facts.pod:
            return Owner(self.name, pod=name, namespace=namespace, slurm_job=facts.slurm_job)
        return Denied(
            f"the kubelet ({self.socket}) did not assign it to its pod {namespace}/{name}"
            + (" (it is another pod's)" if assigned is not None else "")
        )

    def describe(self) -> str:
        """The rule this check applies, for refusal messages."""
        return f"the kubelet ({self.socket}) assigned the GPU to its pod"


def pod_name(uid: str, pod_logs: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of pod ``uid`` from the kubelet's log directory, or ``None``."""
    try:
        entries = os.listdir(pod_logs)
    except OSError:
        return None
    for entry in entries:
        parts = entry.split("_")
        if len(parts) == 3 and parts[2] == uid:
            return parts[0], parts[1]
    return None


class Ownership:
    """The configured mechanisms (none: no check, every allowed peer owns every GPU).

    ``/proc`` is read on a pool of its own, the kubelet asked on another
    (:class:`KubeletAssignments`), never on the daemon's event loop or each other's threads.
    """

    def __init__(
        self,
        device_node: DeviceNodeOwnership | None = None,
        pod_resources: PodResourcesOwnership | None = None,
        proc: str = "/proc",
        pod_logs: str | None = None,
    ) -> None:
        self.device_node = device_node
        self.pod_resources = pod_resources
        self.proc = proc
        if pod_logs is None:
            pod_logs = pod_resources.pod_logs if pod_resources is not None else DEFAULT_POD_LOGS
        self.pod_logs = pod_logs
        self._procfs = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpud-procfs")

    @property
    def checked(self) -> bool:
        """Whether any ownership check is configured."""
        return self.device_node is not None or self.pod_resources is not None

    def describe(self) -> str:
        """The rules the configured checks apply, for refusal messages."""
        if self.pod_resources is not None and self.device_node is not None:
            return (
                f"{self.pod_resources.describe()} (a process in a pod), or "
                f"{self.device_node.describe()} (a process in no pod)"
            )
        parts = [m.describe() for m in (self.device_node, self.pod_resources) if m is not None]
        return " or ".join(parts) if parts else "unchecked (--ownership none)"

    def _facts(self, pid: int) -> _Facts:
        if pid <= 0:
            return _Facts()
        slurm = procfs.environ_value(pid, "SLURM_JOB_ID", self.proc) or ""
        uid = procfs.pod_uid(pid, self.proc)
        pod = pod_name(uid, self.pod_logs) if uid is not None else None
        return _Facts(slurm, uid, pod)

    async def _off_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._procfs, fn, *args)

    async def check(self, pid: int, uuid: str, minor: int) -> Owner | Denied:
        """Whether process ``pid`` owns the GPU, and why (or why not)."""
        facts: _Facts = await self._off_loop(self._facts, pid)
        labels = {"slurm_job": facts.slurm_job}
        if facts.pod is not None:
            labels.update(namespace=facts.pod[0], pod=facts.pod[1])
        if not self.checked:
            return Owner("unchecked", **labels)
        if self.pod_resources is not None and facts.pod_uid is not None:
            return await self.pod_resources.owner(facts, uuid)  # a pod: the kubelet decides
        if self.device_node is not None:
            if not await self._off_loop(self.device_node.owns, pid, minor):
                return Denied(self.device_node.describe().replace("has", "does not have", 1))
            # A host process with a kubelet: not a GPU the kubelet's last answer gives a pod
            # (never waited for: a slow kubelet does not delay the lease).
            last = self.pod_resources.kubelet.peek() if self.pod_resources is not None else None
            if last is not None and uuid in last:
                return Denied("the kubelet assigned it to a pod, and this process runs in none")
            return Owner(self.device_node.name, **labels)
        return Denied("it runs in no Kubernetes pod (its cgroup is not in the kubelet's hierarchy)")

    def close(self) -> None:
        """Stop the threads that read ``/proc`` and ask the kubelet."""
        self._procfs.shutdown(wait=False, cancel_futures=True)
        if self.pod_resources is not None:
            self.pod_resources.kubelet.close()
