"""The vocabulary Perseus's core, server and rank client share.

Pure Python, so that the light rank client can import it without the scheduler's stack:

* :mod:`perseus_common.kinds` — the instruction kinds a pipeline runs;
* :mod:`perseus_common.orders` — the built-in pipeline orders (GPipe, 1F1B, interleaved 1F1B) as
  plain lists;
* :mod:`perseus_common.profile_csv` — the one reader of ``stage,instruction,frequency,time,energy``
  profiles (the core wraps it in numpy, the simulated GPU uses it as is);
* :mod:`perseus_common.gpus` — the table of GPUs whose blocking power has been measured (and
  their maximum power limit);
* :mod:`perseus_common.clocks` — the SM clock bound and NVML's clock-event reason names;
* :mod:`perseus_common.located_error` — :class:`~perseus_common.located_error.LocatedError`, the one
  constructor of errors at a row and field of an input (the profile errors);
* :mod:`perseus_common.proto` — the ``perseus.v1`` wire protocol (``.proto`` and generated stubs);
* :mod:`perseus_common.wire` — the values of every ``perseus.v1`` message and their one
  encoder/decoder (:mod:`perseus_common.wire.codec`), used by the rank client and the server alike.
"""

from __future__ import annotations

from perseus_common.gpus import KNOWN_GPUS, KnownGpu, known_gpu_for
from perseus_common.kinds import INSTRUCTION_KINDS
from perseus_common.profile_csv import ProfileFormatError

__all__ = ["INSTRUCTION_KINDS", "KNOWN_GPUS", "KnownGpu", "ProfileFormatError", "known_gpu_for"]
