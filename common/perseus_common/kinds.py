"""The instruction kinds a pipeline rank runs.

``backward_input`` / ``backward_weight`` are the two halves of a backward pass in zero-bubble
schedules (input gradient first, weight gradient later).
"""

from __future__ import annotations

__all__ = ["INSTRUCTION_KINDS"]

#: Every instruction kind a profile, a schedule or a plan may name.
INSTRUCTION_KINDS: tuple[str, ...] = ("forward", "backward", "backward_input", "backward_weight")
