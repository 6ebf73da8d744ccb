"""The physical bounds of what ranks and operators report, the same on every path.

The paths are gRPC reports and REST straggler reports. An iteration or instruction time, an energy,
and the slow-stage factors derived from them; and what one registration may carry (its clocks and
names), so that a job's size in memory and in its status is bounded by its world size. A value
outside its bounds is refused naming the field; inside them, every figure the server derives (a
straggler's time, a slow-stage factor, a power, a power budget's lowest power, the status) stays
finite.

Why these numbers: an iteration of more than ``MAX_SECONDS`` (11.6 days) or an energy beyond
``MAX_ENERGY`` (10 kW for that long) is no measurement; products and sums of a few million such
values stay far below the largest float.
"""

from __future__ import annotations

import math

from perseus_server.domain.errors import BadRequest

__all__ = [
    "MAX_ENERGY",
    "MAX_GPU_NAME",
    "MAX_HOSTNAME",
    "MAX_SUPPORTED_CLOCKS",
    "MAX_INSTRUCTION_SECONDS",
    "MAX_SECONDS",
    "MAX_STAGE_FACTOR",
    "MIN_SECONDS",
    "MAX_TRANSFER_SECONDS",
    "MIN_TRANSFER_SECONDS",
    "TRANSFER_DIRECTIONS",
    "bounded_factor",
    "check_energy",
    "check_seconds",
]

MIN_SECONDS = 1e-6
"""The shortest iteration time (s) a report may carry."""
MAX_SECONDS = 1e6
"""The longest iteration time (s) a report (or a reported straggler) may carry."""
MAX_INSTRUCTION_SECONDS = MAX_SECONDS
"""The longest time (s) one measured instruction may take (any positive time is short enough: the
slow-stage factors it gives are clamped, :func:`bounded_factor`)."""
MIN_TRANSFER_SECONDS = 1e-9
"""The shortest time (s) one measured P2P transfer may take: a clock tick can read 0, and the
client sends that as this tiniest positive time."""
MAX_TRANSFER_SECONDS = MAX_SECONDS
"""The longest time (s) one measured P2P transfer may take."""
TRANSFER_DIRECTIONS = ("forward", "backward")
"""A transfer's direction across a stage boundary: activations forward, gradients backward."""
MAX_ENERGY = 1e4 * MAX_SECONDS
"""The most energy (J) an iteration or an instruction may report (10 kW for ``MAX_SECONDS``)."""
MAX_STAGE_FACTOR = 100.0
"""The largest slow-stage factor (measured over profiled time) a re-solve uses, and the inverse
of the smallest; a stage measured further off is taken at this factor (as a reported straggler's
``slowdown``, at most 100)."""

MAX_SUPPORTED_CLOCKS = 512
"""The most distinct SM clocks a rank may register (GPUs list well under 200)."""
MAX_GPU_NAME = 128
"""The longest GPU name (characters) a rank may register."""
MAX_HOSTNAME = 253
"""The longest host name (characters) a rank may register (a DNS name's limit)."""


def check_seconds(value: float, field: str, where: str, low: float, high: float) -> None:
    """Refuse (:class:`BadRequest` naming ``field``) a time outside ``[low, high]`` seconds."""
    if not (math.isfinite(value) and low <= value <= high):
        raise BadRequest(
            f"{where}must be a number of seconds in [{low:g}, {high:g}], got {value!r}",
            field=field,
        )


def check_energy(value: float, field: str, where: str) -> None:
    """Refuse (:class:`BadRequest` naming ``field``) an energy outside ``[0, MAX_ENERGY]`` J."""
    if not (math.isfinite(value) and 0 <= value <= MAX_ENERGY):
        raise BadRequest(
            f"{where}must be a number of joules in [0, {MAX_ENERGY:g}], got {value!r}",
            field=field,
        )


def bounded_factor(factor: float) -> float:
    """A slow-stage factor clamped to ``[1 / MAX_STAGE_FACTOR, MAX_STAGE_FACTOR]`` (finite)."""
    if math.isnan(factor):
        return 1.0
    return min(max(factor, 1.0 / MAX_STAGE_FACTOR), MAX_STAGE_FACTOR)
