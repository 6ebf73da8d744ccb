"""What the daemon reads about its peers from ``/proc``.

Liveness, parents, uids, open device nodes, the cgroup's Kubernetes pod UID and the Slurm job id.

Everything takes the pid as the kernel reported it (``SO_PEERCRED``) and returns ``None`` (or an
empty result) when the process is gone or its files cannot be read; nothing here raises for a
process that vanished. ``proc`` is the procfs mount (``/proc``; a test may point elsewhere only
for what this machine cannot produce: see ``docs/gpud.md``).
"""

from __future__ import annotations

import os
import re
import stat

__all__ = [
    "NVIDIA_MAJOR",
    "start_time",
    "parent",
    "real_uid",
    "ancestors",
    "open_nvidia_minors",
    "open_paths",
    "pod_in_cgroup",
    "pod_uid",
    "environ_value",
]

#: The character-device major number of ``/dev/nvidia<N>`` (the GPUs; ``nvidiactl`` is minor 255).
NVIDIA_MAJOR = 195
_HEX = r"[0-9a-f]"
_UID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_QOS = ("besteffort", "burstable")
#: The kubelet's pod cgroups, by driver: (top, QoS levels, the pod's own cgroup).
_CGROUPFS = ("kubepods", _QOS, re.compile(rf"pod({_UID})"))
_SYSTEMD = (
    "kubepods.slice",
    tuple(f"kubepods-{q}.slice" for q in _QOS),
    re.compile(rf"kubepods(?:-(?:besteffort|burstable))?-pod({_UID.replace('}-', '}_')})\.slice"),
)


def _stat_fields(pid: int, proc: str) -> list[str] | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; split after the last ')'.
    end = raw.rfind(")")
    return raw[end + 2 :].split() if end > 0 else None


def start_time(pid: int, proc: str = "/proc") -> int | None:
    """The process's start time (clock ticks since boot), or ``None`` when it is gone or a zombie.

    A pid and its start time name one process: a pid reused by a new process has another.
    """
    if pid <= 0:
        return None
    fields = _stat_fields(pid, proc)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def parent(pid: int, proc: str = "/proc") -> int | None:
    """The parent's pid (``None`` when unknown)."""
    fields = _stat_fields(pid, proc)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def real_uid(pid: int, proc: str = "/proc") -> int | None:
    """The process's real uid (``None`` when unknown)."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def ancestors(pid: int, proc: str = "/proc", *, limit: int = 64) -> list[int]:
    """``pid`` and its parents with the same real uid, nearest first.

    Pid 1 is never included (init, or a container's first process, which is no one's proof of
    ownership but its own), and a process that is gone has none (not even itself).
    """
    uid = real_uid(pid, proc)
    if uid is None:
        return []
    out: list[int] = []
    current: int | None = pid
    while current is not None and current > 1 and len(out) < limit:
        if real_uid(current, proc) != uid:
            break
        out.append(current)
        current = parent(current, proc)
    return out


def _fds(pid: int, proc: str) -> list[str]:
    try:
        return [f"{proc}/{pid}/fd/{fd}" for fd in os.listdir(f"{proc}/{pid}/fd")]
    except OSError:
        return []


def open_nvidia_minors(pid: int, proc: str = "/proc", major: int = NVIDIA_MAJOR) -> set[int]:
    """Minor numbers of the NVIDIA GPU device nodes the process has open.

    The nodes are character devices of ``major``, 195, minor below 255. The node is matched by
    its device number, not its name, so a node that a container runtime created under another
    path counts too.
    """
    minors = set()
    for link in _fds(pid, proc):
        try:
            st = os.stat(link)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major:
            minor = os.minor(st.st_rdev)
            if minor < 255:
                minors.add(minor)
    return minors


def open_paths(pid: int, proc: str = "/proc") -> set[str]:
    """The paths of every file the process has open (``readlink`` of its fds)."""
    paths = set()
    for link in _fds(pid, proc):
        try:
            paths.add(os.readlink(link))
        except OSError:
            continue
    return paths


def pod_in_cgroup(path: str) -> str | None:
    """The pod UID of a cgroup path when it lies in the kubelet's pod hierarchy, else ``None``.

    Only the kubelet's own layout counts, from the hierarchy's root: ``/kubepods[/<qos>]/pod<uid>``
    (cgroupfs driver) or ``/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_>.slice``
    (systemd driver), and what lies below. A cgroup elsewhere whose path merely contains
    ``pod<uid>`` (``/user.slice/.../pod<uid>``, which a delegated subtree lets its user create) is
    no pod. A path seen from another cgroup namespace starts with ``..`` (the reader's own cgroup
    is below the common ancestor); only the kubelet's hierarchy itself can then start right after
    the ``..``: a QoS or pod level is accepted there, as the reader is inside ``kubepods``.
    """
    parts = [p for p in path.strip().split("/") if p]
    relative = bool(parts) and parts[0] == ".."
    while parts and parts[0] == "..":
        parts.pop(0)
    for top, qos, pod in (_CGROUPFS, _SYSTEMD):
        rest = parts
        if rest[:1] == [top]:
            rest = rest[1:]
        elif not relative:
            continue
        if rest[:1] and rest[0] in qos:
            rest = rest[1:]
        match = pod.fullmatch(rest[0]) if rest else None
        if match:
            return match.group(1).replace("_", "-")
    return None


def pod_uid(pid: int, proc: str = "/proc") -> str | None:
    """The Kubernetes pod UID of the process's own cgroup (see :func:`pod_in_cgroup`), or ``None``.

    ``None``: not in a pod, unreadable, or two hierarchies naming different pods.
    """
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = {uid for line in lines if (uid := pod_in_cgroup(line.split(":", 2)[-1]))}
    return found.pop() if len(found) == 1 else None


def environ_value(pid: int, key: str, proc: str = "/proc") -> str | None:
    """``key`` in the process's environment as it started (``/proc/PID/environ``), or ``None``.

    The process chose its environment: use the value as a label, never as a proof.
    """
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return None
    prefix = key.encode() + b"="
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode(errors="replace")[:128]
    return None
