"""The demo's analysis (``perseus_demo.analysis``): its tables, ratios and promises.

On hand-made step records (two one-stage pipelines through the phases), not a run: which
promise is missed and why, phase 2's and phase 5's step times against the max-clock steps
interleaved with them, and the uniform power limit phase 5 is compared with.
"""

from __future__ import annotations

from typing import Any

import pytest

from perseus_demo import analyse
from perseus_demo.analysis import uniform_power_limit_phase
from perseus_demo.phases import REFERENCE, REFERENCES
from perseus_demo.profile import blocking_power_for, profile_path, slice_profile
from perseus_demo.report import phase5_lines

from .records import FRONTIER, budget, records


@pytest.mark.parametrize(
    ("restore_at", "missed"),
    [(3, []), (5, []), (6, ["phase 4 back to the default plan by step 5"]),
     (None, ["phase 4 back to the default plan by step 5"])],
)  # fmt: skip
def test_a_missed_promise_is_named_and_fails_the_demo(
    restore_at: int | None, missed: list[str]
) -> None:
    """A replan must take effect with two steady steps of the phase left to measure."""
    res = analyse(
        records(restore_at), FRONTIER, stages=1, pipelines=2, blocking_power=10.0,
        straggler=0.2, default_index=0,
    )  # fmt: skip
    c = res["checks"]
    assert c["phase3_replanned_after"] == 2 and c["phase4_restored_after"] == restore_at
    assert c["phase2_saving"] == pytest.approx(0.1) == c["phase2_predicted_saving"]
    assert c["missed"] == missed
    assert c["ok"] is (not missed)


def _interleave(
    records: list[dict[str, Any]], phase: str, times: list[float], reference: list[float]
) -> list[dict[str, Any]]:
    """``records`` with ``phase``'s steps at ``times`` and its max-clock steps at ``reference``.

    The max-clock steps are labelled ``REFERENCES[phase]``, as the ranks record them.
    """
    for r in records:
        plan = [s for s in r["steps"] if s["phase"] == phase]
        for s, t in zip(plan, times, strict=True):
            s["step_time"] = s["iteration_time"] = t
        r["steps"] += [
            {**plan[0], "phase": REFERENCES[phase], "step_time": t, "expected_time": None}
            for t in reference
        ]
    return records


def _with_load_between_phases(phase2: list[float], reference: list[float]) -> list[dict[str, Any]]:
    """:func:`~demo.records.records` with phase 2 and its interleaved max-clock steps at these step times.

    Phase 1 ran before the load came: 1.0 s a step.
    """
    return _interleave(records(3), "perseus", phase2, reference)


@pytest.mark.parametrize(
    ("phase2", "reference", "ratio", "missed"),
    [
        # The machine got 4 % busier after phase 1: plan and max clocks alike.
        ([1.04] * 8, [1.04] * 8, 1.0, []),
        # One max-clock step held up does not make the plan look faster (the median).
        ([1.04] * 8, [1.04] * 7 + [1.5], 1.0, []),
        # The plan 4 % slower than max clocks under the same load: missed.
        ([1.04] * 8, [1.0] * 8, 1.04, ["phase 2 no more than 2.5 % slower than max clocks"]),
    ],
)
def test_phase2_is_timed_against_the_interleaved_max_clock_steps(
    phase2: list[float], reference: list[float], ratio: float, missed: list[str]
) -> None:
    res = analyse(
        _with_load_between_phases(phase2, reference), FRONTIER, stages=1, pipelines=2,
        blocking_power=10.0, straggler=0.2, default_index=0,
    )  # fmt: skip
    c = res["checks"]
    assert c["phase2_time_reference"] == "interleaved max-clock steps"
    assert c["phase2_time_ratio"] == pytest.approx(ratio)
    assert c["phase2_time_ratio_phase1"] == pytest.approx(1.04)
    assert c["missed"] == missed
    assert REFERENCE in res["steps"]
    # Records without interleaved steps: against phase 1, as before.
    old = analyse(
        records(3), FRONTIER, stages=1, pipelines=2, blocking_power=10.0, straggler=0.2,
        default_index=0,
    )  # fmt: skip
    assert old["checks"]["phase2_time_reference"] == "phase 1"


@pytest.mark.parametrize(
    ("step", "uniform_slowdown", "server_point", "missed"),
    [((1.2, 80.0), 0.25, 1, []),
     ((1.2, 100.0), 0.25, 1, ["phase 5 within the power budget"]),  # 2 x 100 J / 1.2 s > 160 W
     ((1.2, 80.0), 0.15, 1, ["phase 5 no slower than a uniform power limit"]),
     ((1.2, 80.0), 0.25, 0, ["phase 5 runs the server's power-budget plan"])],
)  # fmt: skip
def test_phase5_promises(
    step: tuple[float, float], uniform_slowdown: float, server_point: int, missed: list[str]
) -> None:
    """Phase 5 must run the server's plan, stay within the budget, and beat a uniform power limit.

    It must be no slower than a uniform power limit with the same average power (its measured
    figures against phase 1).
    """
    res = analyse(
        records(3, budget=step), FRONTIER, stages=1, pipelines=2, blocking_power=10.0,
        straggler=0.2, default_index=0, power_budget=budget(uniform_slowdown, server_point),
    )  # fmt: skip
    c = res["checks"]
    p5 = c["phase5"]
    assert p5["measured_power"] == pytest.approx(2 * step[1] / step[0])
    assert p5["time_ratio"] == pytest.approx(step[0]) and p5["energy_ratio"] == pytest.approx(
        2 * step[1] / 200.0
    )
    assert p5["uniform_step_time"] == pytest.approx(1 + uniform_slowdown)
    assert p5["uniform_energy"] == pytest.approx(0.9 * 200.0)
    assert c["missed"] == missed and c["ok"] is (not missed)
    assert "Phase 5: power budget 160 W (80 % of the max-clock 200 W)" in "\n".join(
        phase5_lines(p5)
    )


def test_the_uniform_power_limit_phase_meets_thebudget() -> None:
    with profile_path(None) as path:
        csv_text, _ = slice_profile(path, 4)
        power = blocking_power_for(path.name, None)
    top = uniform_power_limit_phase(csv_text, stages=4, microbatches=6, pipelines=2,
                                    blocking_power=power, watts=1e9)  # fmt: skip
    assert top["slowdown"] == pytest.approx(0.0, abs=1e-12) and top["energy_ratio"] == 1.0
    w = 0.85 * top["average_power"]
    u = uniform_power_limit_phase(csv_text, stages=4, microbatches=6, pipelines=2,
                                  blocking_power=power, watts=w)  # fmt: skip
    assert u["average_power"] <= w * (1 + 1e-12) and u["slowdown"] > 0.02
    assert u["energy_ratio"] < 1
    low = uniform_power_limit_phase(csv_text, stages=4, microbatches=6, pipelines=2,
                                    blocking_power=power, watts=1.0)  # fmt: skip
    assert low["limit"] is None and "no uniform power limit" in low["error"]


@pytest.mark.parametrize(
    ("power_budget", "reference", "ratio", "missed"),
    [
        # The machine got 6 % busier after phase 1: the plan 1.2 x max clocks under that load
        # (against phase 1 it reads 1.272, beyond the uniform limit's 1.19 + 2.5 %).
        ([1.272] * 8, [1.06] * 8, 1.2, []),
        # One max-clock step held up does not make the plan look faster (the median).
        ([1.272] * 8, [1.06] * 7 + [1.9], 1.2, []),
        # The plan 1.272 x max clocks under the same load: missed.
        ([1.272] * 8, [1.0] * 8, 1.272, ["phase 5 no slower than a uniform power limit"]),
    ],
)
def test_phase5_is_timed_against_its_interleaved_max_clock_steps(
    power_budget: list[float], reference: list[float], ratio: float, missed: list[str]
) -> None:
    """Phase 5's slowdown is against the max-clock steps interleaved with it, not phase 1's."""
    recs = _interleave(records(3, budget=(1.2, 80.0)), "power-budget", power_budget, reference)
    res = analyse(
        recs, FRONTIER, stages=1, pipelines=2, blocking_power=10.0, straggler=0.2,
        default_index=0, power_budget=budget(0.19, 1),
    )  # fmt: skip
    p5 = res["checks"]["phase5"]
    assert res["checks"]["missed"] == missed
    assert p5["time_ratio"] == pytest.approx(ratio)
    assert p5["time_reference"] == "interleaved max-clock steps"
    assert p5["time_ratio_phase1"] == pytest.approx(1.272)  # still reported
    assert REFERENCES["power-budget"] in res["steps"] and REFERENCE not in res["steps"]
    text = "\n".join(phase5_lines(p5))
    assert f"{100 * (ratio - 1):+.2f} % against interleaved max-clock steps" in text
    assert "+27.20 % against phase 1" in text
