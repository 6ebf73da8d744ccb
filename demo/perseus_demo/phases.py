"""The demo's phases: what the rank program runs and the analysis measures, in order."""

from __future__ import annotations

__all__ = ["PHASES", "PHASE_TITLES"]

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
