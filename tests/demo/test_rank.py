"""One demo rank's own parts (``perseus_demo.rank``): the interleaved max-clock step, the records.

A real :class:`~perseus_client.PerseusClient` (offline, no server) on a real simulated GPU behind
the demo's :class:`~perseus_demo.timeline.TimelineGpu`; a whole rank, over gloo against a real
server, runs in ``tests/demo/test_demo.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus_client import PerseusClient, RankPosition, SimulatedGpu
from perseus_common.wire.values import PlanStep, PlanUpdate
from perseus_demo.phases import REFERENCES
from perseus_demo.rank import _reference_step, _step_record, _write_result
from perseus_demo.timeline import TimelineGpu

CSV = (
    "stage,instruction,frequency,time,energy\n"
    "0,forward,1410,0.010,3.0\n0,forward,1200,0.012,2.6\n"
    "0,backward,1410,0.020,6.0\n0,backward,1200,0.024,5.2\n"
)
#: The plan: both instructions at 1200 MHz.
PLAN = PlanUpdate(
    3, (PlanStep("forward", 0, 1200, 0), PlanStep("backward", 0, 1200, 0)), reason="the plan",
    expected_iteration_time=0.036,
)  # fmt: skip


@pytest.fixture
def rank() -> Iterator[tuple[PerseusClient, TimelineGpu]]:
    sim = SimulatedGpu.from_profile_csv(CSV, stage=0, time_scale=0, blocking_power=50)
    gpu = TimelineGpu(sim)
    client = PerseusClient(
        offline=True, gpu=gpu, handle_signals=False, rank=RankPosition(global_rank=0)
    )
    client.use_plan(PLAN)
    try:
        yield client, gpu
    finally:
        client.close()


def _trainer(gpu: TimelineGpu, seen: list[dict[str, Any]], newer: PlanUpdate | None = None) -> Any:
    """A ``train_step`` as the rank's: one iteration, recorded; ``newer`` arrives meanwhile."""

    def train_step(
        client: PerseusClient, label: str, index: int, last: tuple[float, int]
    ) -> tuple[float, int]:
        with client.iteration():
            if newer is not None:
                client.use_plan(newer)  # as the plan stream would, mid-iteration
            for kind in ("forward", "backward"):
                with client.instruction(kind, microbatch=0):
                    pass
        spans = [s[3] for s in gpu.spans[-2:]]
        t, e = gpu.timestamp(), int(gpu.inner.energy_mj())
        rep = client.last_report
        assert rep is not None
        seen.append({"label": label, "index": index, "clocks": spans, "version": rep.plan_version,
                     "reported_energy": rep.energy, "energy": e - last[1]})  # fmt: skip
        return t, e

    return train_step


@pytest.mark.parametrize("phase", sorted(REFERENCES))
def test_a_reference_step_runs_at_max_clocks_unmetered_and_the_plan_comes_back(
    rank: tuple[PerseusClient, TimelineGpu], phase: str
) -> None:
    client, gpu = rank
    seen: list[dict[str, Any]] = []
    train = _trainer(gpu, seen)
    last = train(client, phase, 0, (gpu.timestamp(), int(gpu.inner.energy_mj())))
    last = _reference_step(client, gpu, train, phase, 0, last)
    train(client, phase, 1, last)
    plan_step, ref, after = seen
    assert plan_step["clocks"] == [1200, 1200] and plan_step["version"] == 3
    assert plan_step["reported_energy"] == pytest.approx(plan_step["energy"] / 1000)
    # the interleaved step: its phase's label, the top clock, no plan, no energy reported ...
    assert ref["label"] == REFERENCES[phase] and ref["index"] == 0
    assert ref["clocks"] == [1410, 1410] and ref["version"] == 0
    assert ref["reported_energy"] == 0.0
    assert ref["energy"] >= 9000  # ... while the rank's own record has what the GPU spent
    # and the plan is back for the next step
    assert after["clocks"] == [1200, 1200] and after["version"] == 3
    assert client.latest_plan is PLAN


def test_a_plan_that_arrives_during_a_reference_step_is_kept(
    rank: tuple[PerseusClient, TimelineGpu],
) -> None:
    client, gpu = rank
    newer = PlanUpdate(4, PLAN.steps, reason="newer")
    seen: list[dict[str, Any]] = []
    last = (gpu.timestamp(), int(gpu.inner.energy_mj()))
    _reference_step(client, gpu, _trainer(gpu, seen, newer), "perseus", 0, last)
    assert client.latest_plan is newer  # not overwritten by the plan from before


def test_a_step_record_says_what_ran_and_the_result_file_is_whole(
    rank: tuple[PerseusClient, TimelineGpu], tmp_path: Path
) -> None:
    client, gpu = rank
    seen: list[dict[str, Any]] = []
    _trainer(gpu, seen)(client, "perseus", 0, (0.0, 0))
    rec = _step_record(client, "perseus", 5, 1.5, 2500, 1.2)
    assert rec == {
        "phase": "perseus", "index": 5, "step_time": 1.5, "energy": 2.5,
        "iteration_time": client.last_report.iteration_time if client.last_report else None,
        "plan_version": 3, "expected_time": 0.036, "reason": "the plan", "slowdown": 1.2,
    }  # fmt: skip
    _write_result({"out_dir": str(tmp_path)}, {"rank": 2, "steps": [rec]}, 2)
    assert json.loads((tmp_path / "rank2.json").read_text())["steps"] == [rec]
    assert [p.name for p in tmp_path.iterdir()] == ["rank2.json"]  # no temporary file left
