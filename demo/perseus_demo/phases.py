"""The demo's phases: what the rank program runs and the analysis measures, in order.

And the one name the ranks and the orchestrator share besides: :data:`JOB_FILE`.
"""

from __future__ import annotations

__all__ = ["JOB_FILE", "PHASES", "PHASE_TITLES", "REFERENCE", "REFERENCES"]

#: The demo's phases, in the order the ranks run them.
PHASES: tuple[str, ...] = ("max-clocks", "perseus", "straggler", "recovery", "power-budget")

#: A phase's title in the report.
PHASE_TITLES: dict[str, str] = {
    "max-clocks": "Phase 1: all max clocks",
    "perseus": "Phase 2: the deployed Perseus plan",
    "straggler": "Phase 3: pipeline 1 slowed",
    "recovery": "Phase 4: pipeline 1 recovered",
    "power-budget": "Phase 5: under a power budget",
}

#: The label of the max-clock steps interleaved with phase 2's (each phase-2 step is followed by
#: one through the same client): the reference phase 2's step time is compared with, measured
#: under the same conditions as phase 2 (see :mod:`perseus_demo.analysis`).
REFERENCE = "max-clocks-interleaved"

#: The phases whose steps are each followed by one at max clocks, and the label of those
#: max-clock steps: phase 2 (no slower than max clocks) and phase 5 (no slower than a uniform
#: power limit, whose slowdown is against max clocks) are timed against them.
REFERENCES: dict[str, str] = {
    "perseus": REFERENCE,
    "power-budget": "max-clocks-interleaved-power-budget",
}

#: The file in the ranks' folder that hands them the job once the server has it ready: the
#: orchestrator starts the ranks first (they import torch and form their process groups
#: meanwhile), and they begin phase 1 when it appears.
JOB_FILE = "job.json"
