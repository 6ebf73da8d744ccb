"""Hand-made step records for the demo's analysis and report tests.

Two one-stage pipelines through the phases, with the frontier and phase 5's budget they run
under: what :func:`perseus_demo.analysis.analyse` reads from the ranks' ``rank<g>.json``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FRONTIER", "budget", "records"]


def records(
    restore_at: int | None, n: int = 8, budget: tuple[float, float] | None = None
) -> list[dict[str, Any]]:
    """Two one-stage pipelines through the four phases.

    Frontier: point 0 (1.0 s, 90 J, the default) and point 1 (1.2 s, 80 J); pipeline 1 straggles
    by 20 % in phase 3, pipeline 0 moves to point 1 from step 2 and back to point 0 at step
    ``restore_at`` of phase 4. ``budget``: phase 5 too, both pipelines at point 1 with these
    (step time, energy).
    """

    def step(phase: str, t: float, e: float, expected: float | None) -> dict[str, Any]:
        return {"phase": phase, "step_time": t, "energy": e, "iteration_time": t,
                "expected_time": expected, "plan_version": 1, "reason": ""}  # fmt: skip

    out = []
    for p in (0, 1):
        steps = [step("max-clocks", 1.0, 100.0, None) for _ in range(n)]
        steps += [step("perseus", 1.0, 90.0, 1.0) for _ in range(n)]
        if p == 0:
            steps += [step("straggler", 1.2, 85.0, 1.0 if i < 2 else 1.2) for i in range(n)]
            back = n if restore_at is None else restore_at
            steps += [step("recovery", 1.0, 90.0, 1.2 if i < back else 1.0) for i in range(n)]
        else:
            steps += [step("straggler", 1.2, 118.0, 1.0) for _ in range(n)]
            steps += [step("recovery", 1.0, 90.0, 1.0) for _ in range(n)]
        if budget is not None:
            steps += [step("power-budget", *budget, 1.2) for _ in range(n)]
        out.append({"pipeline": p, "stage": 0, "steps": steps})
    return out


FRONTIER = {
    "points": [{"time": 1.0, "energy": 90.0}, {"time": 1.2, "energy": 80.0}],
    "max_frequency_time": 1.0,
    "max_frequency_energy": 100.0,
}


def budget(uniform_slowdown: float, point: int) -> dict[str, Any]:
    """Phase 5 at 80 % of the max-clock 200 W.

    The server's plan is ``point`` (the ranks run point 1, 2 x 80 J / 1.2 s).
    """
    return {
        "fraction": 0.8, "max_clock_power": 200.0, "watts": 160.0,
        "plan": {"index": point, "time": 1.2, "energy": 80.0, "average_power": 133.3},
        "uniform": {"limit": 70.0, "slowdown": uniform_slowdown, "energy_ratio": 0.9,
                    "average_power": 159.0},
        "server_measured": {"average_power": 133.0, "energy_saved": 500.0},
        "constraint": "own policy",
    }  # fmt: skip
