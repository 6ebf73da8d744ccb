"""PerseusClient without a server: plans, order checks, profiling, clock resets.

Which plan runs when (the newest, at an iteration boundary) is ``test_plan_choice.py``'s.
"""

from __future__ import annotations

import pytest
from client_data import ORDER, STEPS, run_iteration

from perseus_client import (
    ConfigError,
    PerseusClient,
    PlanMismatchError,
)
from perseus_common.wire.values import PlanUpdate, ProfilingTask


def test_clock_in_effect_is_the_plans_for_every_instruction(client, rec, plan_of):
    client.use_plan(plan_of(1, STEPS))
    for _ in range(3):
        run_iteration(client)
    assert [(i.kind, i.microbatch, i.mhz) for i in rec.instructions] == [
        (k, m, f) for k, m, f in STEPS
    ] * 3


def test_strict_mismatch_raises_and_resets_clocks(client, rec, plan_of):
    client.use_plan(plan_of(1, STEPS))
    with pytest.raises(PlanMismatchError, match=r"executed backward\(microbatch 0\)"):
        run_iteration(client, [("forward", 0), ("backward", 0)])
    # The exception escaped the iteration: the GPU was unlocked while it unwinds.
    assert rec.inner.locked_clock is None
    # And training can go on with the next iteration.
    run_iteration(client)
    assert rec.instructions[-1].mhz == 1200


def test_iteration_report_has_times_energy_and_instructions(client, sim_gpu, plan_of):
    client.use_plan(plan_of(1, STEPS))
    run_iteration(client)
    r = client.last_report
    assert r.iteration == 0 and r.plan_version == 1
    # time_scale=0: simulated time advances by exactly the instructions' profile times.
    assert r.iteration_time == pytest.approx(0.012 + 0.015 + 0.020 + 0.024)
    assert r.energy == pytest.approx(2.6 + 2.4 + 6.0 + 5.2)
    assert [(m.kind, m.microbatch, m.stage, m.frequency_mhz) for m in r.instructions] == [
        (k, m, 0, f) for k, m, f in STEPS
    ]
    assert [m.time for m in r.instructions] == pytest.approx([0.012, 0.015, 0.020, 0.024])
    assert all(m.energy == 0 for m in r.instructions)  # per-instruction energy only when profiling


def test_profiling_runs_at_the_task_clock_and_measures_after_warmup(client, rec):
    client.use_plan(
        PlanUpdate(9, (), profiling=ProfilingTask(1000, warmup_iterations=2, iterations=2))
    )
    reports = []
    for _ in range(5):
        run_iteration(client)
        reports.append(client.last_report)
    assert {i.mhz for i in rec.instructions} == {1000}
    assert [len(r.instructions) for r in reports] == [0, 0, 4, 4, 4]
    m = reports[2].instructions
    assert [(x.kind, x.microbatch, x.frequency_mhz) for x in m] == [
        (k, mb, 1000) for k, mb in ORDER
    ]
    assert [x.time for x in m] == pytest.approx([0.015, 0.015, 0.030, 0.030])
    assert [x.energy for x in m] == pytest.approx([2.4, 2.4, 4.8, 4.8])
    assert all(r.plan_version == 9 for r in reports)


def test_close_resets_clocks_and_is_idempotent(rec, plan_of):
    c = PerseusClient(offline=True, gpu=rec, handle_signals=False)
    c.use_plan(plan_of(1, STEPS[:1]))
    with c.iteration(), c.instruction("forward", microbatch=0):
        assert rec.inner.locked_clock == 1200
    with c:
        pass
    c.close()
    assert rec.inner.locked_clock is None
    assert [r.op for r in rec.requests].count("reset") == 1


def test_missing_configuration_names_the_variable(monkeypatch, sim_gpu):
    monkeypatch.delenv("PERSEUS_SERVER", raising=False)
    monkeypatch.delenv("PERSEUS_JOB", raising=False)
    with pytest.raises(ConfigError, match="PERSEUS_SERVER"):
        PerseusClient(job="j", gpu=sim_gpu, handle_signals=False)
    with pytest.raises(ConfigError, match="PERSEUS_JOB"):
        PerseusClient("localhost:1", gpu=sim_gpu, handle_signals=False)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK"):
        PerseusClient(offline=True, gpu=sim_gpu, handle_signals=False)


def test_environment_configures_the_default_nvml_gpu_in_dry_run(monkeypatch, fake_nvml):
    import sys
    import types

    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    sys.modules["pynvml"].__dict__.update(vars(nvml))
    monkeypatch.setenv("PERSEUS_DRY_RUN", "1")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "0")
    c = PerseusClient(offline=True, handle_signals=False)
    assert c.global_rank == 5 and c.gpu.dry_run
    with c.iteration(), c.instruction("forward", microbatch=0):
        c.controller.flush()  # NVML backends apply off the training thread; wait for it here
    c.close()
    assert c.gpu.requests == [("set", 1410), ("reset", None)]
    assert nvml.state["calls"] == []
