"""The demo's figure (``perseus_demo.plotting``): ``demo.png`` from a run's results.

From :func:`perseus_demo.analysis.analyse` on hand-made records and ranks with one step's
timeline each (as :mod:`perseus_demo.rank` keeps them).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from perseus_demo import analyse
from perseus_demo.plotting import demo_png

from .records import FRONTIER, records

#: The frontier document as the server gives it: points with their lower bounds.
SERVER_FRONTIER = {
    **FRONTIER,
    "points": [{**p, "lower_bound": p["energy"] - 5.0} for p in FRONTIER["points"]],
}


def _ranks() -> list[dict[str, Any]]:
    """Two one-stage pipelines, a forward and a backward per phase step, at two clocks."""
    out = []
    for p in (0, 1):
        spans = {
            phase: {"index": 7, "spans": [["forward", 0, None, clock, 10.0, 10.3],
                                          ["backward", 0, None, clock, 10.3, 10.9]]}
            for phase, clock in (("perseus", 1410), ("straggler", 1200 if p == 0 else 1410))
        }  # fmt: skip
        out.append({"pipeline": p, "stage": 0, "time_scale": 0.5, "timelines": spans})
    return out


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    return width, height


def test_the_figure_is_drawn_from_the_results_and_the_timelines(tmp_path: Path) -> None:
    res = analyse(
        records(3), FRONTIER, stages=1, pipelines=2, blocking_power=10.0, straggler=0.2,
        default_index=0,
    )  # fmt: skip
    png = tmp_path / "demo.png"
    demo_png(png, res, SERVER_FRONTIER, _ranks(), stages=1)
    assert _png_size(png) == (1300, 900)
    assert png.stat().st_size > 20_000  # a frontier, its marks and two timelines drawn


def test_a_run_without_timelines_still_draws_the_frontier(tmp_path: Path) -> None:
    """Phases with no recorded step (e.g. a run cut short) leave their timeline panel empty."""
    res = analyse(
        records(3), FRONTIER, stages=1, pipelines=2, blocking_power=10.0, straggler=0.2,
        default_index=0,
    )  # fmt: skip
    ranks = _ranks()
    for r in ranks:
        del r["timelines"]["straggler"]
    png = tmp_path / "demo.png"
    demo_png(png, res, SERVER_FRONTIER, ranks, stages=1)
    assert _png_size(png) == (1300, 900)
