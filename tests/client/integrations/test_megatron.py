"""Megatron-core integration.

Megatron's pipelined schedules (and even ``forward_backward_no_pipelining``, which allocates a CUDA
tensor) need CUDA, so on CPU these tests run Megatron's real ``forward_step`` / ``backward_step``
on a tiny model, called through the module attributes exactly as the schedules call them, with a
real offline ``PerseusClient`` on a recording simulated GPU. The full schedule runs in
``test_no_pipelining_schedule_on_gpu`` where CUDA is available.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")

from integration_harness import profile_slice, simulated_gpu  # noqa: E402
from megatron.core import ModelParallelConfig  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402

from perseus.schedules import Schedule, interleaved_1f1b, one_f_one_b  # noqa: E402
from perseus_client import PerseusClient  # noqa: E402
from perseus_client.integrations import megatron as perseus_megatron  # noqa: E402
from perseus_common.wire.values import PlanStep, PlanUpdate  # noqa: E402

MICROBATCHES = 4
CLOCKS = [1410, 1005, 900, 1200, 1110, 1305, 1005, 900]


class Tiny(torch.nn.Module):
    """The smallest model Megatron's forward_step accepts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.config = ModelParallelConfig()
        self.model_type = ModelType.encoder_or_decoder
        self.input_tensor: Any = None

    def set_input_tensor(self, tensor: Any) -> None:
        self.input_tensor = tensor

    def forward(self, x: Any) -> Any:
        return self.lin(x)


def forward_step_func(data: Iterator[Any], model: Tiny) -> tuple[Any, Any]:
    x, y = next(data)
    out = model(x)

    def loss(o: Any) -> tuple[Any, dict[str, Any]]:
        value = ((o - y) ** 2).mean()
        return value, {"loss": value.detach()}

    return out, loss


def no_pipelining(model: Tiny, num_microbatches: int) -> list[float]:
    """Megatron's forward_backward_no_pipelining loop on CPU.

    The real ``forward_step`` and ``backward_step``, looked up on the module at call time as
    Megatron does.
    """
    gen = torch.Generator().manual_seed(3)
    data = iter(
        [
            (torch.randn(2, 4, generator=gen), torch.randn(2, 4, generator=gen))
            for _ in range(num_microbatches)
        ]
    )
    store: list[dict[str, Any]] = []
    for i in range(num_microbatches):
        out, _ = schedules.forward_step(
            forward_step_func,
            data,
            model,
            num_microbatches,
            None,
            store,
            model.config,
            1,
            False,
            is_first_microbatch=i == 0,
            current_microbatch=i,
        )
        schedules.backward_step(None, out, None, model.model_type, model.config)
    return [float(d["loss"]) for d in store]


@contextlib.contextmanager
def offline_client(order: list[list[Any]]) -> Iterator[tuple[PerseusClient, Any]]:
    gpu = simulated_gpu(profile_slice(1), [0])
    steps = tuple(PlanStep(k, m, f, s) for (k, m, s), f in zip(order, CLOCKS, strict=True))
    with PerseusClient(offline=True, gpu=gpu, handle_signals=False) as client:
        client.use_plan(PlanUpdate(1, steps))
        yield client, gpu


@pytest.mark.parametrize("pp", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_orders_are_megatron_1f1b(pp: int, m: int) -> None:
    orders = perseus_megatron.export_orders(m, pp)
    assert orders == one_f_one_b(pp, m).to_json()["orders"]


@pytest.mark.parametrize(
    ("pp", "vp", "m"), [(2, 2, 4), (2, 3, 6), (4, 2, 8), (4, 2, 12), (2, 2, 2)]
)
def test_interleaved_orders_follow_get_schedule_table(pp: int, vp: int, m: int) -> None:
    orders = perseus_megatron.export_orders(m, pp, virtual_pipeline_size=vp)
    assert orders == interleaved_1f1b(pp, m, vp).to_json()["orders"]
    sched = Schedule.from_orders(orders)
    assert sched.stages == pp * vp
    table = schedules.get_schedule_table(m, vp, pp)
    for rank, order in enumerate(orders):
        forwards = [(mb, st) for kind, mb, st in order if kind == "forward"]
        assert forwards == [(mb, chunk * pp + rank) for mb, chunk in table]


def test_hooks_follow_the_order_and_set_the_planned_clocks() -> None:
    order = perseus_megatron.export_orders(MICROBATCHES, 1)[0]
    reference_model = Tiny()
    reference = no_pipelining(reference_model, MICROBATCHES)
    with (
        offline_client(order) as (client, gpu),
        perseus_megatron.instrument(client, order) as hooks,
    ):
        model = Tiny()
        run = hooks.wrap(no_pipelining)
        losses = run(model, MICROBATCHES)
        assert torch.equal(model.lin.weight.grad, reference_model.lin.weight.grad)
        run(model, MICROBATCHES)
    assert losses == reference
    ran = [[r.kind, r.microbatch, r.stage, r.mhz] for r in gpu.instructions]
    assert ran == [[*op, f] for op, f in zip(order, CLOCKS, strict=True)] * 2
    assert client.iterations == 2


def test_remove_restores_megatron() -> None:
    originals = schedules.forward_step, schedules.backward_step
    hooks = perseus_megatron.instrument(_Recorder(), perseus_megatron.export_orders(2, 1)[0])
    assert schedules.forward_step is not originals[0]
    with pytest.raises(RuntimeError, match="already"):
        perseus_megatron.instrument(_Recorder(), perseus_megatron.export_orders(2, 1)[0])
    hooks.remove()
    hooks.remove()
    assert (schedules.forward_step, schedules.backward_step) == originals


def test_a_call_that_contradicts_the_order_is_named() -> None:
    order = perseus_megatron.export_orders(2, 2, virtual_pipeline_size=2)[0]
    rec = _Recorder()
    with perseus_megatron.instrument(rec, order) as hooks:
        hooks.start_iteration()
        with pytest.raises(
            RuntimeError, match="microbatch 1 where the order has forward of microbatch 0"
        ):
            schedules.forward_step(current_microbatch=1, vp_stage=0)
        hooks.start_iteration()
        with pytest.raises(RuntimeError, match="model chunk 1"):
            schedules.forward_step(current_microbatch=0, vp_stage=1)
        hooks.start_iteration()
        with pytest.raises(RuntimeError, match="only 4 backwards"):
            for _ in range(5):
                with contextlib.suppress(TypeError):  # the real backward_step needs arguments
                    schedules.backward_step()
    assert [c[0] for c in rec.ops] == ["backward"] * 4


def test_forward_only_passes_through() -> None:
    rec = _Recorder()
    with perseus_megatron.instrument(rec, perseus_megatron.export_orders(2, 1)[0]) as hooks:

        def evaluate(*, forward_only: bool) -> None:
            no_pipelining_forward_only(Tiny())

        hooks.wrap(evaluate)(forward_only=True)
    assert rec.ops == [] and rec.iterations == 0


def no_pipelining_forward_only(model: Tiny) -> None:
    data = iter([(torch.zeros(2, 4), torch.zeros(2, 4))])
    with torch.no_grad():
        schedules.forward_step(
            forward_step_func,
            data,
            model,
            1,
            None,
            [],
            model.config,
            1,
            False,
            current_microbatch=0,
        )


def test_bad_orders_are_named() -> None:
    with pytest.raises(ValueError, match="pipeline_rank"):
        perseus_megatron.stage_order(4, 2, 2)
    with pytest.raises(ValueError, match="num_microbatches"):
        perseus_megatron.export_orders(0, 2)
    with pytest.raises(ValueError, match="only forward and backward"):
        perseus_megatron.instrument(_Recorder(), [["backward_input", 0, 0]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Megatron's schedules need CUDA")
def test_no_pipelining_schedule_on_gpu(tmp_path: Any) -> None:
    import os

    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        model = Tiny().cuda()
        order = perseus_megatron.export_orders(MICROBATCHES, 1)[0]
        gen = torch.Generator().manual_seed(3)
        data = [
            (torch.randn(2, 4, generator=gen).cuda(), torch.randn(2, 4, generator=gen).cuda())
            for _ in range(MICROBATCHES)
        ]
        with (
            offline_client(order) as (client, gpu),
            perseus_megatron.instrument(client, order) as hooks,
        ):
            forward_backward = hooks.wrap(get_forward_backward_func())
            forward_backward(
                forward_step_func=forward_step_func,
                data_iterator=iter(data),
                model=[model],
                num_microbatches=MICROBATCHES,
                seq_length=1,
                micro_batch_size=2,
            )
        ran = [[r.kind, r.microbatch, r.stage, r.mhz] for r in gpu.instructions]
        assert ran == [[*op, f] for op, f in zip(order, CLOCKS, strict=True)]
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


class _Recorder:
    def __init__(self) -> None:
        self.ops: list[tuple[str, int, int]] = []
        self.iterations = 0

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        self.iterations += 1
        yield

    @contextlib.contextmanager
    def instruction(self, kind: str, *, microbatch: int, stage: int) -> Iterator[None]:
        self.ops.append((kind, microbatch, stage))
        yield
