"""Plan building and the cursor's order checking."""

from __future__ import annotations

import pytest
from client_data import STEPS

from perseus_client import ConfigError, PlanCursor, PlanMismatchError
from perseus_client.plan import compile_plan, plan_from_steps, received_plan
from perseus_common.proto import perseus_pb2
from perseus_common.wire.codec import decode_plan
from perseus_common.wire.values import PlanStep, PlanUpdate, ProfilingTask


def test_cursor_yields_each_steps_clock(plan_of):
    cur = PlanCursor(1410)
    cur.start(plan_of(3, STEPS))
    assert [cur.next_clock(k, m, None) for k, m, _ in STEPS] == [1200, 1000, 1410, 1200]
    cur.finish()


def test_no_plan_runs_everything_at_max_clock():
    cur = PlanCursor(1410)
    cur.start(None)
    assert cur.next_clock("forward", 7, 2) == 1410
    cur.finish()


def test_mismatch_names_executed_and_expected(plan_of):
    cur = PlanCursor(1410)
    cur.start(plan_of(5, STEPS))
    cur.next_clock("forward", 0, None)
    with pytest.raises(PlanMismatchError) as info:
        cur.next_clock("backward", 0, None)
    msg = str(info.value)
    assert "executed backward(microbatch 0)" in msg
    assert "expects forward(microbatch 1, stage 0)" in msg and "version 5" in msg
    assert info.value.executed == ("backward", 0, None)
    assert info.value.expected == ("forward", 1, 0)
    assert info.value.position == 1


def test_stage_is_checked_when_given(plan_of):
    cur = PlanCursor(1410)
    cur.start(plan_of(1, STEPS, stage=2))
    assert cur.next_clock("forward", 0, 2) == 1200
    with pytest.raises(PlanMismatchError, match="stage 3"):
        cur.next_clock("forward", 1, 3)


def test_too_many_and_too_few_instructions(plan_of):
    cur = PlanCursor(1410)
    cur.start(plan_of(1, STEPS[:1]))
    cur.next_clock("forward", 0, None)
    with pytest.raises(PlanMismatchError, match="has only 1 instructions"):
        cur.next_clock("forward", 1, None)
    cur.start(plan_of(1, STEPS))
    cur.next_clock("forward", 0, None)
    with pytest.raises(PlanMismatchError, match="ended after 1 instructions") as info:
        cur.finish()
    assert info.value.executed is None


def test_non_strict_reports_and_falls_back_to_max_for_the_iteration(plan_of):
    seen = []
    cur = PlanCursor(1410, strict=False, on_mismatch=seen.append)
    cur.start(plan_of(1, STEPS))
    assert cur.next_clock("forward", 1, None) == 1410
    assert cur.next_clock("forward", 0, None) == 1410  # rest of the iteration at max
    cur.finish()  # no second report
    assert len(seen) == 1
    cur.start(plan_of(1, STEPS))  # next iteration is back on the plan
    assert cur.next_clock("forward", 0, None) == 1200


def test_profiling_task_overrides_every_clock(plan_of):
    cur = PlanCursor(1410)
    cur.start(PlanUpdate(2, (), profiling=ProfilingTask(1005, 1, 2)))
    assert cur.next_clock("forward", 0, None) == 1005
    assert cur.next_clock("backward", 9, None) == 1005


def test_plan_from_steps_accepts_frontier_plan_steps():
    plan = plan_from_steps(
        [{"instruction": "forward", "microbatch": 0, "stage": 1, "frequency": 1200}], version=4
    )
    assert plan.version == 4 and plan.steps == (PlanStep("forward", 0, 1200, 1),)
    with pytest.raises(ConfigError, match=r"steps\[0\]\.instruction"):
        plan_from_steps([{"instruction": "fwd", "microbatch": 0, "frequency": 1}])
    with pytest.raises(ConfigError, match=r"steps\[0\]"):
        plan_from_steps([{"instruction": "forward"}])


def test_a_received_plan_is_the_decoded_wire_value():
    msg = perseus_pb2.PlanUpdate(
        version=7,
        steps=[
            perseus_pb2.PlanStep(instruction="backward", microbatch=2, frequency_mhz=990, stage=1)
        ],
        reason="straggler",
        expected_iteration_time=1.5,
    )
    plan = received_plan(decode_plan(msg))
    assert (plan.version, plan.steps, plan.reason, plan.expected_iteration_time) == (
        7,
        (PlanStep("backward", 2, 990, 1),),
        "straggler",
        1.5,
    )
    assert plan.profiling is None
    msg.profiling.CopyFrom(
        perseus_pb2.ProfilingTask(frequency_mhz=1200, warmup_iterations=2, iterations=3)
    )
    assert received_plan(decode_plan(msg)).profiling == ProfilingTask(1200, 2, 3)


def test_a_received_profiling_task_is_sane():
    """A task at clock 0 is none; negative iteration counts count as 0; a sane plan is kept."""
    steps = (PlanStep("forward", 0, 1200, 0),)
    none = received_plan(PlanUpdate(3, steps, profiling=ProfilingTask(0, 2, 3)))
    assert none.profiling is None and compile_plan(none, 1410).clocks == (1200,)
    neg = received_plan(PlanUpdate(3, steps, profiling=ProfilingTask(1005, -1, -4)))
    assert neg.profiling == ProfilingTask(1005, 0, 0)
    sane = PlanUpdate(3, steps, profiling=ProfilingTask(1005, 1, 2))
    assert received_plan(sane) is sane
