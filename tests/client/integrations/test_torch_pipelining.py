"""Unit tests of the torch.distributed.pipelining hooks on real schedules in one process.

A 1-rank gloo group holds every stage; the hooks drive a recording client and a real offline client.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from integration_harness import BLOCKING_POWER, profile_slice  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as tsched  # noqa: E402

from perseus.problem import EnergyProblem  # noqa: E402
from perseus.profiles import parse_profile_csv  # noqa: E402
from perseus.schedules import Schedule, gpipe, one_f_one_b  # noqa: E402
from perseus_client.integrations import torch_pipelining as tp  # noqa: E402

ALL = [
    "ScheduleGPipe",
    "Schedule1F1B",
    "ScheduleInterleaved1F1B",
    "ScheduleLoopedBFS",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV",
]


class Recorder:
    """Records what the hooks report (the client surface, nothing else)."""

    def __init__(self) -> None:
        self.ops: list[list[Any]] = []
        self.iterations = 0

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        self.iterations += 1
        yield

    @contextlib.contextmanager
    def instruction(self, kind: str, *, microbatch: int, stage: int) -> Iterator[None]:
        self.ops.append([kind, microbatch, stage])
        yield


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def make(name: str, microbatches: int = 2) -> Any:
    cls = getattr(tsched, name)
    multi = issubclass(cls, tsched.PipelineScheduleMulti)
    n = 2 if multi else 1
    torch.manual_seed(0)
    stages = [PipelineStage(torch.nn.Linear(4, 4), i, n, torch.device("cpu")) for i in range(n)]
    return cls(
        stages if multi else stages[0], microbatches, loss_fn=lambda o, t: ((o - t) ** 2).mean()
    )


def step(schedule: Any) -> list[float]:
    gen = torch.Generator().manual_seed(5)
    losses: list[Any] = []
    schedule.step(
        torch.randn(4, 4, generator=gen), target=torch.randn(4, 4, generator=gen), losses=losses
    )
    return [float(v.detach()) for v in losses]


def test_importing_the_integrations_imports_no_framework() -> None:
    code = (
        "import sys\n"
        "import perseus_client.integrations.torch_pipelining, perseus_client.integrations.deepspeed\n"
        "import perseus_client.integrations.megatron\n"
        "heavy = [m for m in ('torch', 'deepspeed', 'megatron', 'scipy', 'networkx') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ALL)
def test_hooks_report_exactly_what_runs(group: None, name: str) -> None:
    schedule = make(name)
    rec = Recorder()
    with tp.instrument(schedule, rec):
        step(schedule)
        step(schedule)
    order = tp.export_orders(schedule)
    assert len(order) == 1
    assert rec.ops == order[0] * 2
    assert rec.iterations == 2
    kinds = {op[0] for op in rec.ops}
    if "ZeroBubble" in name:
        assert {"backward_input", "backward_weight"} <= kinds


@pytest.mark.parametrize("name", ALL)
def test_removing_restores_the_framework(group: None, name: str) -> None:
    schedule = make(name)
    reference = step(make(name))
    hooks = tp.instrument(schedule, Recorder())
    with pytest.raises(RuntimeError, match="already"):
        tp.instrument(schedule, Recorder())
    hooks.remove()
    hooks.remove()  # idempotent
    for stage in tp.schedule_stages(schedule):
        for method in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            assert method not in vars(stage)
    assert "step" not in vars(schedule)
    assert step(schedule) == reference


class TransferRecorder(Recorder):
    """A recorder that also takes timed transfers (what turns transfer timing on)."""

    def __init__(self) -> None:
        super().__init__()
        self.transfers: list[tuple[int, str, int, float]] = []

    def record_transfer(
        self, boundary: int, direction: str, microbatch: int, seconds: float
    ) -> None:
        self.transfers.append((boundary, direction, microbatch, seconds))


P2P_METHODS = ("get_fwd_send_ops", "get_fwd_recv_ops", "get_bwd_send_ops", "get_bwd_recv_ops")


def test_transfer_hooks_are_process_wide_and_removed_with_the_last_schedule(group: None) -> None:
    torchs = (tsched._batch_p2p, tsched._wait_batch_p2p)
    a, b = make("ScheduleInterleaved1F1B"), make("Schedule1F1B")
    rec = TransferRecorder()
    ha, hb = tp.instrument(a, rec), tp.instrument(b, TransferRecorder())
    assert ha.transfers and hb.transfers
    assert tsched._batch_p2p is not torchs[0] and tsched._wait_batch_p2p is not torchs[1]
    step(a)
    assert rec.ops and rec.transfers == []  # every stage on this rank: no P2P op, no transfer
    ha.remove()
    assert tsched._batch_p2p is not torchs[0]  # b's hooks still time transfers
    hb.remove()
    assert (tsched._batch_p2p, tsched._wait_batch_p2p) == torchs
    for stage in tp.schedule_stages(a) + tp.schedule_stages(b):
        assert not set(P2P_METHODS) & set(vars(stage))
    with tp.instrument(a, TransferRecorder(), transfers=False) as off:
        assert not off.transfers and tsched._batch_p2p is torchs[0]
    with tp.instrument(a, Recorder()) as plain:  # a client without record_transfer
        assert not plain.transfers and tsched._batch_p2p is torchs[0]


def test_eval_is_not_an_instrumented_iteration(group: None) -> None:
    schedule = make("ScheduleGPipe")
    rec = Recorder()
    with tp.instrument(schedule, rec):
        schedule.eval(torch.randn(4, 4), target=torch.randn(4, 4))
    assert rec.ops == [] and rec.iterations == 0


def test_bad_arguments_are_named(group: None) -> None:
    with pytest.raises(TypeError, match="schedule"):
        tp.instrument(object(), Recorder())
    with pytest.raises(TypeError, match="client"):
        tp.instrument(make("ScheduleGPipe"), object())  # type: ignore[arg-type]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("name", ALL)
def test_orders_build_a_deadlock_free_dag(name: str, ranks: int) -> None:
    microbatches = 8
    orders = tp.orders_for(name.removeprefix("Schedule"), ranks, microbatches)
    sched = Schedule.from_orders(orders)
    assert sched.ranks == ranks and sched.microbatches == microbatches
    profile = parse_profile_csv(profile_slice(sched.stages))
    problem = EnergyProblem.build(profile, sched, BLOCKING_POWER)  # raises on a cyclic order
    assert problem is not None


def test_single_stage_orders_are_ours_not_torchs_pipeline_order() -> None:
    # torch 2.13's Schedule1F1B._get_pipeline_order starts the last rank at microbatch 1; the loop
    # that runs starts at 0, as perseus.schedules.one_f_one_b (checked against real runs).
    assert tp.orders_for("1F1B", 4, 8) == one_f_one_b(4, 8).to_json()["orders"]
    assert tp.orders_for("GPipe", 4, 8) == gpipe(4, 8).to_json()["orders"]
    assert tp.orders_for("1F1B", 4, 8)[3][0] == ["forward", 0, 3]


def test_orders_for_matches_the_live_schedule(group: None) -> None:
    for name in ALL:
        cls = getattr(tsched, name)
        per_rank = 2 if issubclass(cls, tsched.PipelineScheduleMulti) else None
        assert tp.orders_for(cls, 1, 4, per_rank) == tp.export_orders(make(name, 4)), name


def test_real_client_rejects_an_order_that_differs_from_its_plan(group: None) -> None:
    from integration_harness import simulated_gpu

    from perseus_client import PerseusClient, PlanMismatchError
    from perseus_common.wire.values import PlanStep, PlanUpdate

    schedule = make("Schedule1F1B", microbatches=2)
    order = tp.export_orders(schedule)[0]
    gpu = simulated_gpu(profile_slice(1), [0])
    clocks = [1410, 1005, 900, 1200]
    wrong = [order[1], order[0], *order[2:]]  # the plan expects another first instruction
    with PerseusClient(offline=True, gpu=gpu, handle_signals=False) as client:
        client.use_plan(
            PlanUpdate(
                1, tuple(PlanStep(k, m, f, s) for (k, m, s), f in zip(order, clocks, strict=True))
            )
        )
        with tp.instrument(schedule, client):
            step(schedule)
            assert [[r.kind, r.microbatch, r.stage, r.mhz] for r in gpu.instructions] == [
                [*op, f] for op, f in zip(order, clocks, strict=True)
            ]
            client.use_plan(PlanUpdate(2, tuple(PlanStep(k, m, 1410, s) for k, m, s in wrong)))
            with pytest.raises(PlanMismatchError):
                step(schedule)
