"""Framework integrations: hook a training framework's pipeline schedule into a Perseus client.

Each submodule adapts one framework and imports it lazily, so importing this package costs nothing:

* :mod:`perseus_client.integrations.torch_pipelining` — ``torch.distributed.pipelining`` schedules
  (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV).
* :mod:`perseus_client.integrations.deepspeed` — DeepSpeed ``PipelineEngine`` with ``TrainSchedule``.
* :mod:`perseus_client.integrations.megatron` — Megatron-core's pipeline schedules.

Every integration drives the same two context managers of :class:`InstructionClient`
(``PerseusClient`` has both), and every one can export the exact per-rank instruction order the
framework runs, as ``[[kind, microbatch, stage], ...]`` per rank, for the server's job schedule.
"""

from perseus_client.integrations._base import (
    INSTRUCTION_KINDS,
    InstructionClient,
    Orders,
    custom_schedule,
)

__all__ = ["INSTRUCTION_KINDS", "InstructionClient", "Orders", "custom_schedule"]
