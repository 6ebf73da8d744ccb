"""The per-instruction hot path: ``begin`` / ``end`` / ``abort`` and the compiled plan."""

from __future__ import annotations

import pytest
from client_data import PROFILE

from perseus_client import (
    PerseusClient,
    PlanMismatchError,
    RankPosition,
    RecordingGpu,
    SimulatedGpu,
)
from perseus_client.controller import FrequencyController
from perseus_client.plan import CompiledPlan

ORDER = [("forward", 0, 1200), ("forward", 1, 1000), ("backward", 0, 1410), ("backward", 1, 1200)]


def client_on(gpu, **kw):
    return PerseusClient(offline=True, gpu=gpu, handle_signals=False, **kw)


def test_begin_end_apply_the_plans_clocks_and_record_what_the_context_managers_record(plan_of):
    runs = []
    for style in ("edges", "context"):
        gpu = RecordingGpu(SimulatedGpu(PROFILE, stage=0, time_scale=0.0))
        client = client_on(gpu)
        client.use_plan(plan_of(1, ORDER))
        with client.iteration():
            for kind, mb, _ in ORDER:
                if style == "edges":
                    client.begin(kind, mb, 0)
                    client.end()
                else:
                    with client.instruction(kind, microbatch=mb, stage=0):
                        pass
        runs.append((client.last_report, [(r.kind, r.microbatch, r.mhz) for r in gpu.instructions]))
        client.close()
    (edges, ran), (context, ran_cm) = runs
    assert ran == ran_cm == [(k, m, f) for k, m, f in ORDER]
    assert edges.instructions == context.instructions
    assert [(i.kind, i.microbatch, i.stage, i.frequency_mhz) for i in edges.instructions] == [
        (k, m, 0, f) for k, m, f in ORDER
    ]
    # Simulated times: 12 ms forward at 1200 MHz, 15 ms at 1000, 20 ms backward at 1410...
    assert [round(i.time, 6) for i in edges.instructions] == [0.012, 0.015, 0.02, 0.024]


def test_an_unchanged_clock_is_not_applied_again(plan_of):
    gpu = RecordingGpu(SimulatedGpu(PROFILE, stage=0, time_scale=0.0))
    client = client_on(gpu)
    client.use_plan(plan_of(1, [("forward", 0, 1200), ("forward", 1, 1200), ("backward", 0, 1000)]))
    for _ in range(2):
        with client.iteration():
            for kind, mb in (("forward", 0), ("forward", 1), ("backward", 0)):
                client.begin(kind, mb, 0)
                client.end()
    assert [r.mhz for r in gpu.requests] == [1200, 1000, 1200, 1000]
    client.close()


def test_without_a_stage_or_a_plan_the_slow_path_records_what_ran(plan_of):
    client = client_on(SimulatedGpu(PROFILE, stage=0, time_scale=0.0), rank=RankPosition())
    with client.iteration():  # no plan: max clock, the executed instructions recorded
        client.begin("forward", 3)
        client.end()
    assert [
        (i.kind, i.microbatch, i.stage, i.frequency_mhz) for i in client.last_report.instructions
    ] == [("forward", 3, 0, 1410)]
    client.use_plan(plan_of(2, [("forward", 0, 1000), ("backward", 0, 1200)]))
    with client.iteration():  # no stage given: matched on kind and microbatch
        client.begin("forward", 0)
        client.end()
        client.begin("backward", 0, 0)
        client.end()
    assert [i.frequency_mhz for i in client.last_report.instructions] == [1000, 1200]
    client.close()


def test_a_mismatch_raises_in_strict_mode_and_runs_at_max_clock_otherwise(plan_of):
    client = client_on(SimulatedGpu(PROFILE, stage=0, time_scale=0.0))
    client.use_plan(plan_of(1, [("forward", 0, 1000), ("forward", 1, 1000)]))
    mismatch = pytest.raises(PlanMismatchError, match=r"expects forward\(microbatch 0, stage 0\)")
    with mismatch, client.iteration():
        client.begin("backward", 0, 0)
    client.close()
    seen = []
    client = client_on(SimulatedGpu(PROFILE, stage=0, time_scale=0.0), strict=False)
    client._path.on_mismatch = seen.append
    client.use_plan(plan_of(1, [("forward", 0, 1000), ("forward", 1, 1000)]))
    with client.iteration():
        for mb in (1, 0):
            client.begin("forward", mb, 0)
            client.end()
    assert len(seen) == 1 and seen[0].position == 0
    assert [(i.microbatch, i.frequency_mhz) for i in client.last_report.instructions] == [
        (1, 1410),
        (0, 1410),
    ]
    client.close()


def test_an_instruction_that_raised_is_not_recorded_and_edges_need_an_iteration(plan_of):
    client = client_on(SimulatedGpu(PROFILE, stage=0, time_scale=0.0))
    client.use_plan(plan_of(1, [("forward", 0, 1000), ("forward", 1, 1200)]))
    with client.iteration():
        client.begin("forward", 0, 0)
        client.abort()
        client.begin("forward", 1, 0)
        client.end()
    assert [(i.microbatch, i.frequency_mhz) for i in client.last_report.instructions] == [(1, 1200)]
    with pytest.raises(Exception, match="inside a client.iteration"):
        client.begin("forward", 0, 0)
    with client.iteration():
        client.begin("forward", 0, 0)
        with pytest.raises(Exception, match="do not nest"):
            client.begin("forward", 1, 0)
        client.end()
        client.begin("forward", 1, 0)
        client.end()
    client.close()


def test_the_compiled_plan_is_flat_and_profiling_runs_every_instruction_at_its_clock(plan_of):
    from perseus_common.wire.values import PlanUpdate, ProfilingTask

    plan = plan_of(3, ORDER)
    c = CompiledPlan(plan, 1410)
    assert c.n == 4 and c.keys[2] == ("backward", 0, 0) and c.clocks == (1200, 1000, 1410, 1200)
    task = PlanUpdate(4, plan.steps, profiling=ProfilingTask(1005, 0, 1))
    assert CompiledPlan(task, 1410).clocks == (1005,) * 4
    assert CompiledPlan(None, 1395).n == 0 and CompiledPlan(None, 1395).fixed == 1395


def test_apply_now_applies_queued_requests_first():
    gpu = RecordingGpu(SimulatedGpu(PROFILE, stage=0, time_scale=0.0))
    ctl = FrequencyController(gpu)
    try:
        ctl.request(1000, wake=False)
        ctl.apply_now(1200)
        ctl.apply_now(1200)  # the clock last requested: nothing to do
        assert [r.mhz for r in gpu.requests] == [1000, 1200]
        assert ctl.applied_clock == 1200 and ctl.applied_seq == 2
    finally:
        ctl.close()
