"""Which GPU is this process's: worked out from what the runtime gave it.

So no node-level index has to be configured.

:func:`discover_gpu` reads ``LOCAL_RANK`` (default 0) and the visible-device list:
``CUDA_VISIBLE_DEVICES`` if set, else ``NVIDIA_VISIBLE_DEVICES`` (the container runtime's; ``all``,
``none``, ``void`` and empty mean no list). Entries are NVML indices or UUIDs (``GPU-...``, a
unique prefix accepted as CUDA accepts it). The process's GPU is entry ``LOCAL_RANK`` of the list,
or the only entry when the list has one (a Slurm task or a pod given one GPU, whatever its rank);
without a list it is GPU ``LOCAL_RANK``. When both are set and ``CUDA_VISIBLE_DEVICES`` holds an
index, it counts the devices the runtime listed (inside a container CUDA sees only those), so
``CUDA_VISIBLE_DEVICES=1`` with ``NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b`` is ``GPU-b``. A UUID is what the daemon leases by; an index from
``CUDA_VISIBLE_DEVICES`` is taken as an NVML index (true when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
NVML's order; use UUIDs otherwise). MIG devices (``MIG-...``) are refused: clocks are per GPU.

The daemon still checks ownership (``docs/gpud.md``): discovery picks which GPU to ask for, it
proves nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

__all__ = ["GpuSelector", "DiscoveryError", "discover_gpu"]


class DiscoveryError(ValueError):
    """The environment names no usable GPU for this process (the message names the variable)."""


@dataclass(frozen=True)
class GpuSelector:
    """A GPU named by UUID (preferred) or NVML index, and where that came from."""

    uuid: str | None = None
    index: int | None = None
    source: str = ""

    def __str__(self) -> str:
        return self.uuid if self.uuid is not None else f"GPU {self.index}"


_NO_LIST = ("", "all", "none", "void")


def _entry(text: str, variable: str) -> GpuSelector:
    text = text.strip()
    if text.startswith("GPU-"):
        return GpuSelector(uuid=text, source=variable)
    if text.startswith("MIG-") or "/" in text or ":" in text:
        raise DiscoveryError(
            f"{variable}: {text!r} is a MIG device; clocks are set per GPU, so Perseus needs "
            "a whole GPU"
        )
    if text.isdigit():
        return GpuSelector(index=int(text), source=variable)
    raise DiscoveryError(f"{variable}: {text!r} is neither a GPU index nor a GPU-... UUID")


def _list(env: Mapping[str, str], variable: str) -> list[str] | None:
    value = env.get(variable)
    if value is None:
        return None
    if not value.strip() and variable == "CUDA_VISIBLE_DEVICES":
        raise DiscoveryError("CUDA_VISIBLE_DEVICES: empty, so this process has no GPU")
    if value.strip().lower() in _NO_LIST:
        return None
    return [e.strip() for e in value.split(",") if e.strip()]


def _pick(entries: list[str], rank: int, variable: str) -> str:
    if len(entries) == 1:
        return entries[0]
    if rank >= len(entries):
        raise DiscoveryError(
            f"LOCAL_RANK {rank} but {variable} lists {len(entries)} GPUs "
            f"({','.join(entries)}); give each process its GPU, or a list with one per local rank"
        )
    return entries[rank]


def discover_gpu(env: Mapping[str, str] | None = None) -> GpuSelector:
    """This process's GPU (see the module docstring); raises :class:`DiscoveryError`."""
    env = os.environ if env is None else env
    raw_rank = env.get("LOCAL_RANK", "").strip()
    try:
        rank = int(raw_rank) if raw_rank else 0
    except ValueError:
        raise DiscoveryError(f"LOCAL_RANK: expected an integer, got {raw_rank!r}") from None
    if rank < 0:
        raise DiscoveryError(f"LOCAL_RANK: must be >= 0, got {rank}")
    cuda = _list(env, "CUDA_VISIBLE_DEVICES")
    runtime = _list(env, "NVIDIA_VISIBLE_DEVICES")
    if cuda is not None:
        chosen = _entry(_pick(cuda, rank, "CUDA_VISIBLE_DEVICES"), "CUDA_VISIBLE_DEVICES")
        if chosen.index is None or runtime is None:
            return chosen
        # In a container CUDA's indices count the devices the runtime gave it, in its order.
        if chosen.index >= len(runtime):
            raise DiscoveryError(
                f"CUDA_VISIBLE_DEVICES: index {chosen.index} but NVIDIA_VISIBLE_DEVICES lists "
                f"{len(runtime)} GPUs ({','.join(runtime)})"
            )
        source = "CUDA_VISIBLE_DEVICES+NVIDIA_VISIBLE_DEVICES"
        return replace(_entry(runtime[chosen.index], "NVIDIA_VISIBLE_DEVICES"), source=source)
    if runtime is not None:
        return _entry(_pick(runtime, rank, "NVIDIA_VISIBLE_DEVICES"), "NVIDIA_VISIBLE_DEVICES")
    return GpuSelector(index=rank, source="LOCAL_RANK" if raw_rank else "default")
