"""The demo's power-swing section against a real server: the answer, the report's lines, the plot.

The plot is recomputed from the answer's clocks and floors with the core's model, so drawing it
also checks that the floors the server sent keep the job's power within the bounds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from perseus.power import SwingBounds
from perseus.power.floors import meets
from perseus_demo.orchestration import _Api
from perseus_demo.profile import slice_profile
from perseus_demo.swing import ask_swing, swing_lines, swing_png
from perseus_server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
BLOCKING = 83.64


def test_the_demo_asks_for_a_bounded_plan_reports_and_draws_it(tmp_path: Path) -> None:
    csv_text, _ = slice_profile(ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv", 4)
    with ServerProcess(tmp_path / "perseus.db") as srv:
        api = _Api(srv.http_url)
        try:
            job = api("POST", "/jobs", json={"stages": 4, "microbatches": 6, "data_parallel": 2,
                                             "blocking_power": BLOCKING})["id"]  # fmt: skip
            api("PUT", f"/jobs/{job}/profile", content=csv_text.encode(),
                headers={"Content-Type": "text/csv"})  # fmt: skip
            api("POST", f"/jobs/{job}/frontier")
            while api("GET", f"/jobs/{job}/frontier", params={"points": False})["status"] != "done":
                time.sleep(0.1)
            swing = ask_swing(api, job)
        finally:
            api.close()
    lines = swing_lines(swing)
    assert "swing 0.30" in lines[2] and "the floors cost" in lines[2]
    assert float(lines[1].split("swing ")[1].split(",")[0]) > 0.3
    png = tmp_path / "swing.png"
    after = swing_png(png, swing, csv_text, 6, BLOCKING, 2)
    assert meets(after, SwingBounds(0.3, 0.12))
    assert after.energy == pytest.approx(swing["energy_with_floors"], rel=1e-6)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert swing["power_timeline"]["swing"] == pytest.approx(0.3, abs=1e-6)
