"""The daemon's reply messages and the GPU a request names (pure functions of the state)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from perseus_common.proto import gpud_pb2
from perseus_gpud.devices import ManagedGpu
from perseus_gpud.ownership import Owner
from perseus_gpud.peers import Peer

__all__ = ["clock_state", "gpu_info", "holder_labels", "resolve_gpu", "status_message"]


def resolve_gpu(
    gpus: Mapping[int, ManagedGpu],
    ref: gpud_pb2.GpuRef | gpud_pb2.SetClock | gpud_pb2.SetPowerFloor,
) -> ManagedGpu:
    """The GPU a request names: by UUID (or a unique prefix of 8 characters or more), else by index.

    Raises ``LookupError`` with a message when it names none.
    """
    uuid = str(ref.uuid)
    if uuid:
        matches = [g for g in gpus.values() if g.uuid == uuid]
        if not matches and len(uuid) >= 8:  # a unique prefix, as CUDA_VISIBLE_DEVICES takes
            matches = [g for g in gpus.values() if g.uuid.startswith(uuid)]
        if len(matches) == 1:
            return matches[0]
        raise LookupError(
            f"GPU {uuid} is not managed by this daemon"
            + (" (the prefix is ambiguous)" if matches else "")
            + f" (it manages {', '.join(g.uuid for g in gpus.values()) or 'none'})",
        )
    gpu = gpus.get(int(ref.index))
    if gpu is None:
        raise LookupError(
            f"GPU {ref.index} is not managed by this daemon (it manages "
            f"{', '.join(map(str, gpus)) or 'none'})",
        )
    return gpu


def gpu_info(gpu: ManagedGpu) -> gpud_pb2.GpuInfo:
    """The ``GpuInfo`` message of a GPU."""
    return gpud_pb2.GpuInfo(
        index=gpu.index,
        name=gpu.name,
        supported_clocks_mhz=gpu.clocks,
        uuid=gpu.uuid,
        max_power_limit_w=gpu.max_power_limit_w,
        floor_unavailable=(
            "the daemon runs read-only: no power floor is applied"
            if gpu.read_only
            else gpu.floor_unavailable or ""
        ),
    )


def clock_state(gpu: ManagedGpu, applied: bool) -> gpud_pb2.ClockState:
    """The ``ClockState`` message of a GPU after a change (``applied``: not read-only)."""
    state = gpud_pb2.ClockState(index=gpu.index, uuid=gpu.uuid, applied=applied)
    if gpu.locked_mhz is not None:
        state.locked_mhz = gpu.locked_mhz
    return state


def status_message(
    gpus: Mapping[int, ManagedGpu],
    holder: Callable[[int], tuple[Peer, Owner] | None],
    read_only: bool,
    lease_timeout: float,
    visible: Collection[int] | None = None,
) -> gpud_pb2.Status:
    """The ``Status`` message: every GPU, its lock and its live holder.

    The GPUs are those of ``visible`` (``None``: all); the holder is ``holder(index)``.
    """
    status = gpud_pb2.Status(read_only=read_only, lease_timeout_s=lease_timeout)
    for index, gpu in gpus.items():
        if visible is not None and index not in visible:
            continue
        entry = status.gpus.add(index=index, name=gpu.name, uuid=gpu.uuid)
        if gpu.locked_mhz is not None:
            entry.locked_mhz = gpu.locked_mhz
        held = holder(index)
        if held is not None:
            peer, owner = held
            entry.holder.CopyFrom(
                gpud_pb2.Holder(
                    pid=peer.pid,
                    uid=peer.uid,
                    pod=owner.pod,
                    namespace=owner.namespace,
                    slurm_job=owner.slurm_job,
                    owned_by=owner.how,
                    job=owner.job,
                    tenant=owner.tenant,
                )
            )
    return status


def holder_labels(owner: Owner | None) -> str:
    """``"; pod ns/name; Slurm job N"`` for log lines and refusals (empty when unknown)."""
    if owner is None:
        return ""
    parts = []
    if owner.job:
        parts.append(f"Perseus job {owner.job}" + (f" of {owner.tenant}" if owner.tenant else ""))
    if owner.pod:
        parts.append(f"pod {owner.namespace}/{owner.pod}")
    if owner.slurm_job:
        parts.append(f"Slurm job {owner.slurm_job}")
    return "".join(f"; {p}" for p in parts)
