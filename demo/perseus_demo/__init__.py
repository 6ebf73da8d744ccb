"""``perseus demo``: the whole system on one machine, with simulated GPUs.

One command starts ``perseus serve`` on a temporary database, registers a job from a real
profile (GPT-3 175B on A100 by default, the first ``--stages`` stages, ``--pipelines``
data-parallel pipelines, 1F1B), computes its time-energy frontier, and launches every rank as a
real process (:mod:`perseus_demo.rank`) running ``torch.distributed.pipelining`` over gloo with a
Perseus client on a :class:`~perseus_client.SimulatedGpu` (profile times scaled by
``--time-scale``, so that a run takes minutes rather than the profile's hours). The ranks run
the five phases of :data:`~perseus_demo.phases.PHASES`, ``--iterations`` steps each:

1. **max-clocks**: no plan, every instruction at the top clock (what training does without
   Perseus);
2. **perseus**: the deployed plan (the frontier's fastest point, no slowdown);
3. **straggler**: pipeline 1's GPUs are ``--straggler`` (20 %) slower; the server detects it
   from the reported iteration times and moves the healthy pipelines to the frontier plan that
   finishes at the straggler's time T';
4. **recovery**: pipeline 1 is back to full speed; the server returns everyone to the default plan;
5. **power-budget**: the job's power budget is set through the server to ``--power-fraction``
   (0.85) of its max-clock average power; the ranks run the plan the server picks, and the demo
   compares its measured power, step time and energy with what a uniform per-GPU power limit
   with the same average power would give (predicted from the profile).

The demo is an application of Perseus, not part of it: it drives the server over its REST API
and the ranks through the client, like any user would. Its modules, one job each:

- :mod:`~perseus_demo.options`: the command line and its checks;
- :mod:`~perseus_demo.profile`: the shipped sample profile, slicing it, its blocking power;
- :mod:`~perseus_demo.orchestration`: the server, the job, the rank processes, the results;
- :mod:`~perseus_demo.rank` (with :mod:`~perseus_demo.timeline`): one training rank;
- :mod:`~perseus_demo.analysis`: per-phase tables and the promises the demo checks;
- :mod:`~perseus_demo.report` and :mod:`~perseus_demo.plotting`: the text report and
  ``demo.png``;
- :mod:`~perseus_demo.cli`: ``perseus demo`` itself (registered with ``perseus`` in
  :mod:`~perseus_demo.commands`).

Importing this package is light (PEP 562): the names below load on first use, so ``perseus
--help`` can list the demo's subcommand on an install without the scheduler.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus_demo.analysis import PHASE2_TIME_TOLERANCE, PHASE5_POWER_TOLERANCE, analyse
    from perseus_demo.cli import main
    from perseus_demo.errors import DemoError
    from perseus_demo.options import DemoOptions, build_parser
    from perseus_demo.phases import PHASES

#: Each public name and the module that defines it.
_EXPORTS = {
    "PHASES": "perseus_demo.phases",
    "PHASE2_TIME_TOLERANCE": "perseus_demo.analysis",
    "PHASE5_POWER_TOLERANCE": "perseus_demo.analysis",
    "DemoError": "perseus_demo.errors",
    "DemoOptions": "perseus_demo.options",
    "analyse": "perseus_demo.analysis",
    "build_parser": "perseus_demo.options",
    "main": "perseus_demo.cli",
}

__all__ = [
    "PHASES",
    "PHASE2_TIME_TOLERANCE",
    "PHASE5_POWER_TOLERANCE",
    "DemoError",
    "DemoOptions",
    "analyse",
    "build_parser",
    "main",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'perseus_demo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
