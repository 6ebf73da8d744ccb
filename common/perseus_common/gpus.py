"""GPUs whose blocking power has been measured: the one table every part of Perseus consults.

Each also carries its maximum power limit (W, the vendor's specification: the highest value
NVML's ``nvmlDeviceGetPowerManagementLimitConstraints`` reports for it), the ``MAXPOWER`` of the
cost policy (``eta``) when the ranks do not report theirs.

The blocking power is what a GPU draws while it waits on a pipeline neighbour (point-to-point
wait): a plan's energy charges it for every second a GPU is not computing. The values are those
measured with the profiles shipped in ``profiles/`` (GPT-3 175B on A100 SXM and A40, from the
Perseus paper's artifact; see ``profiles/README.md``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KnownGpu", "KNOWN_GPUS", "known_gpu_for"]


@dataclass(frozen=True)
class KnownGpu:
    """One GPU model with a measured blocking power.

    Attributes:
        key: the lower-case tag that names the GPU in a profile's file name (``"a100"``).
        name: the GPU's marketing name.
        blocking_power: watts the GPU draws while it waits on a pipeline neighbour.
        max_power_limit: the GPU's maximum power limit in watts (vendor specification).
    """

    key: str
    name: str
    blocking_power: float
    max_power_limit: float


#: Every GPU with a measured blocking power (and its maximum power limit).
KNOWN_GPUS: tuple[KnownGpu, ...] = (
    KnownGpu("a100", "NVIDIA A100 SXM", 83.64, 400.0),
    KnownGpu("a40", "NVIDIA A40", 70.38, 300.0),
)


def known_gpu_for(profile_name: str) -> KnownGpu | None:
    """The known GPU a profile's file name names, or ``None``.

    A name names a GPU when it contains the GPU's key as a word of its own (delimited by anything
    but a letter or digit), so ``gpt3_a100-sxm.csv`` is an A100 while ``ma400.csv`` and
    ``a1000.csv`` name no known GPU. A name that names two GPUs (``a40_vs_a100.csv``) is
    ambiguous and gives ``None`` too: the caller must then be told the blocking power.
    """
    name = profile_name.lower()
    found = [
        gpu
        for gpu in KNOWN_GPUS
        if re.search(rf"(?<![a-z0-9]){re.escape(gpu.key)}(?![a-z0-9])", name) is not None
    ]
    return found[0] if len(found) == 1 else None
