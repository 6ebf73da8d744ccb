"""The demo's power swing: the job's power over time with and without a swing bound.

After the job is solved, the demo asks the server, as a user would, for the plan at T0 with its
power floors under ``max_swing`` / ``max_ramp`` (``GET /jobs/{id}/plan?slowdown=0&max_swing=..``;
nothing is deployed). The report prints the plan's timeline alone and with the floors and what
the floors cost; ``swing.png`` draws both over two iterations, recomputed here from the answer's
clocks and floors with the core's model (so the picture is also a check of the answer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["MAX_RAMP", "MAX_SWING", "ask_swing", "swing_lines", "swing_png"]

#: The bounds the demo asks for: swing <= 0.30, every 100 ms change <= 12 % of the peak.
MAX_SWING = 0.30
MAX_RAMP = 0.12


def ask_swing(api: Any, job: str) -> dict[str, Any]:
    """The server's swing-bounded answer at T0 (``GET /jobs/{id}/plan``)."""
    doc = api(
        "GET",
        f"/jobs/{job}/plan",
        params={"slowdown": 0, "max_swing": MAX_SWING, "max_ramp": MAX_RAMP},
    )
    keep = (
        "time", "energy", "frequencies", "power_floors", "floor_energy", "energy_with_floors",
        "power_timeline", "power_timeline_before", "swing_bounds", "plan_is_frontier_point",
    )  # fmt: skip
    return {k: doc[k] for k in keep if k in doc}


def swing_lines(s: dict[str, Any]) -> list[str]:
    """The report's lines: the timeline alone, with the floors, and their cost."""
    a, b = s["power_timeline"], s["power_timeline_before"]
    plain = s["energy_with_floors"] - s["floor_energy"]
    return [
        f"Power swing at T0 (asked of the server; not deployed): max_swing {MAX_SWING}, "
        f"max_ramp {MAX_RAMP} of the peak per 100 ms.",
        f"  plan alone:  peak {b['peak_w']:.0f} W, trough {b['trough_w']:.0f} W, swing "
        f"{b['swing']:.2f}, largest 100 ms change {b['max_change_w']['0.1']:.0f} W.",
        f"  with floors: peak {a['peak_w']:.0f} W, trough {a['trough_w']:.0f} W, swing "
        f"{a['swing']:.2f}, largest 100 ms change {a['max_change_w']['0.1']:.0f} W; the floors "
        f"cost {s['floor_energy']:.1f} J per iteration ({100 * s['floor_energy'] / plain:+.1f} %).",
    ]


def swing_png(path: Path, s: dict[str, Any], csv_text: str, microbatches: int, power: float,
              pipelines: int) -> Any:  # fmt: skip
    """Draw ``swing.png``: the job's power over two iterations, alone and with the floors.

    Returns the timeline with the floors (a :class:`~perseus.power_timeline.PowerTimeline`).
    """
    from perseus.power import SwingBounds
    from perseus.power.timeline_plot import timeline_png
    from perseus.power_timeline import PowerTimeline, rank_power
    from perseus.problem import EnergyProblem
    from perseus.profiles import parse_profile_csv
    from perseus.schedules import one_f_one_b

    freqs = [f for rank in s["frequencies"] for f in rank]
    problem = EnergyProblem.build(
        parse_profile_csv(csv_text), one_f_one_b(len(s["frequencies"]), microbatches), power
    )
    plan = np.array(
        [int(np.flatnonzero(problem.freqs[v] == f)[0]) for v, f in enumerate(freqs)]
        + [0] * (problem.num_nodes - len(freqs)),
        dtype=np.uint8,
    )
    rp = rank_power(problem, plan)
    edges = [x for r in s["power_floors"] for a, b, _ in r for x in (a, b)]
    times = np.unique(np.concatenate([rp.times, edges]))
    mid = 0.5 * (times[:-1] + times[1:])
    watts = rp.watts[:, np.searchsorted(rp.times, mid, side="right") - 1]
    for r, spans in enumerate(s["power_floors"]):
        for a, b, w in spans:
            on = (mid >= a) & (mid < b)
            watts[r, on] = np.maximum(watts[r, on], w)
    after = PowerTimeline(times, pipelines * watts.sum(axis=0))
    before = rp.total(pipelines)
    cost = 100 * s["floor_energy"] / (s["energy_with_floors"] - s["floor_energy"])
    title = f"demo job at T0: floors cost {s['floor_energy']:.0f} J per iteration ({cost:+.1f} %)"
    path.write_bytes(timeline_png(before, after, SwingBounds(MAX_SWING, MAX_RAMP), title=title))
    return after
