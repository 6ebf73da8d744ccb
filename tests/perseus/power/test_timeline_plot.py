"""The power-timeline plot and the swing outputs of ``perseus frontier`` (``perseus.power.timeline_plot``).

``swing_outputs`` against the core's own timeline and swing plan of the same point, the PNG it
writes, and ``timeline_png``'s drawing with and without floors. The command line that calls them
is ``tests/perseus/test_cli.py``'s.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from perseus.frontier import Frontier
from perseus.power import SwingBounds
from perseus.power.floors import meets
from perseus.power.timeline_plot import swing_outputs, timeline_png
from perseus.power_timeline import plan_timeline
from perseus.problem import EnergyProblem

BOUNDS = SwingBounds(0.30, 0.12)


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def test_without_bounds_the_output_is_the_points_own_timeline(
    swing_problem: EnergyProblem, swing_frontier: Frontier, tmp_path: Path
) -> None:
    k = len(swing_frontier) // 2
    out, line = swing_outputs(swing_frontier, swing_problem, {"point": k}, None, None)
    want = plan_timeline(swing_problem, swing_frontier.plans[k])
    assert out == {"power_timeline": want.to_json()}
    assert line.startswith(f"perseus: point {k}'s power: peak {want.peak:.0f} W")
    assert "\n" not in line and not list(tmp_path.iterdir())


def test_with_bounds_the_plan_and_floors_meet_them_and_are_drawn(
    swing_problem: EnergyProblem, swing_frontier: Frontier, tmp_path: Path
) -> None:
    png = tmp_path / "t.png"
    selected = {"point": 0, "slowdown": 0.0}
    out, line = swing_outputs(swing_frontier, swing_problem, selected, BOUNDS, str(png))
    swing = out["swing"]
    assert swing["time"] <= swing_frontier.max_frequency_time * (1 + 1e-12)  # slowdown 0
    assert swing["energy"] == pytest.approx(swing["plan_energy"] + swing["floor_energy"])
    assert len(swing["power_floors"]) == swing_frontier.schedule.ranks
    after = swing["power_timeline"]
    assert after["swing"] <= 0.30 + 1e-6
    assert set(after["max_change_w"]) == {"0.1"}  # the bound's window is the 100 ms one
    assert out["power_timeline"]["swing"] > after["swing"]
    assert "max_swing=0.3, max_ramp=0.12" in line and "floors" in line
    assert png_size(png.read_bytes()) == (990, 506)  # 9 x 4.6 inches at 110 dpi


def test_timeline_png_draws_the_floors_and_the_bound(
    swing_problem: EnergyProblem, swing_frontier: Frontier
) -> None:
    from perseus.power import plan_for_swing

    before = plan_timeline(swing_problem, swing_frontier.plans[0])
    sp = plan_for_swing(swing_frontier, swing_problem, BOUNDS, swing_frontier.max_frequency_time)
    assert meets(sp.timeline, BOUNDS)
    alone = timeline_png(before)
    floored = timeline_png(before, sp.timeline, BOUNDS, under=sp.before)
    assert png_size(alone) == png_size(floored) == (990, 506)
    assert alone != floored
    assert timeline_png(before, title="x") != alone
