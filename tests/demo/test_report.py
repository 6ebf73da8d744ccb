"""The demo's text report (``perseus_demo.report``): tables, the replanning log, the checks.

From :func:`perseus_demo.analysis.analyse` on hand-made records (:mod:`.records`), with what the
orchestrator adds (the server's replans and metrics, the wall time, the output paths).
"""

from __future__ import annotations

from typing import Any

from perseus_demo import analyse
from perseus_demo.phases import PHASE_TITLES
from perseus_demo.report import phase_tables, report

from .records import FRONTIER, budget, records


def _result(restore_at: int | None) -> dict[str, Any]:
    res = analyse(
        records(restore_at, budget=(1.2, 80.0)), FRONTIER, stages=1, pipelines=2,
        blocking_power=10.0, straggler=0.2, default_index=0, power_budget=budget(0.25, 1),
    )  # fmt: skip
    res.update(
        replans=[
            {"version": 2, "why": "pipeline 1 detected slow", "changed": True},
            {"version": 3, "why": "pipeline 1 recovered", "changed": False},
        ],
        replan_metrics=['perseus_replans_total{reason="detected"} 1'],
        wall_seconds={"total": 81.6},
        output="/runs/demo",
        png="/runs/demo/demo.png",
    )
    return res


def test_a_kept_run_reports_every_phase_the_replans_and_no_miss() -> None:
    res = _result(3)
    text = report(res)
    for title in PHASE_TITLES.values():
        assert title in text
    assert "  v2: pipeline 1 detected slow\n" in text + "\n"
    assert "  v3: pipeline 1 recovered (no change)" in text
    assert 'Metrics: perseus_replans_total{reason="detected"} 1' in text
    # phase 2: against phase 1 (these records have no interleaved steps), saving 10 % of 10 %
    assert "Phase 2: step time +0.00 % vs max clocks (phase 1); saving 10.00 % measured vs " in text
    assert "Phase 3: healthy pipeline replanned after 2 step(s)" in text
    assert "Phase 4: back to the default plan after 3 step(s)." in text
    assert "Phase 5: power budget 160 W" in text and "vs max clocks: step time +20.00 %" in text
    assert "MISSED" not in text
    assert text.endswith("Wall time 82 s. Wrote /runs/demo/demo.png and /runs/demo/results.json.")


def test_a_missed_promise_is_named_in_the_report() -> None:
    text = report(_result(None))
    assert "Phase 4: back to the default plan after None step(s)." in text
    assert "MISSED: phase 4 back to the default plan by step 5." in text


def test_a_phase_table_has_a_row_per_pipeline_with_its_plans() -> None:
    res = _result(3)
    tables = phase_tables(res).rstrip("\n").split("\n\n")
    assert [t.split("  (")[0] for t in tables] == list(PHASE_TITLES.values())
    straggler = next(t for t in tables if t.startswith(PHASE_TITLES["straggler"]))
    rows = straggler.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["0", "1"]
    assert rows[0].split()[7] == "0,1"  # pipeline 0 ran points 0 then 1 (after "saving %")
    assert rows[1].split()[7] == "0"  # the straggler kept the default plan
    assert "(steady steps 3-7;" in straggler
