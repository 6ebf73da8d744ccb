"""What every integration shares: the order format it exports, the wrapper its hooks call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from integration_harness import executed, profile_slice, simulated_gpu

from perseus.schedules import Schedule
from perseus_client.integrations import custom_schedule
from perseus_client.integrations._base import InstructionHooks


def test_custom_schedule_is_what_the_server_and_core_accept() -> None:
    orders = [[["forward", 0, 0], ["backward", 0, 0]], [["forward", 0, 1], ["backward", 0, 1]]]
    doc = custom_schedule(orders)
    assert doc == {"name": "custom", "orders": orders}
    assert Schedule.from_json(doc).ranks == 2


@pytest.mark.parametrize(
    ("orders", "message"),
    [
        ([], "at least one rank"),
        ([[["forwards", 0, 0]]], r"orders\[0\]\[0\]"),
        ([[["forward", 0]]], r"orders\[0\]\[0\]"),
        ([[["forward", "0", 0]]], "integers"),
    ],
)
def test_bad_orders_are_named(orders: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        custom_schedule(orders)


# --- the one wrapper around an instruction, which every integration's hooks call ------------


@pytest.fixture
def hooked() -> Iterator[tuple[InstructionHooks, Any]]:
    """Hooks on a real offline client over a recording simulated GPU (2 stages' profile)."""
    from perseus_client import PerseusClient

    gpu = simulated_gpu(profile_slice(2), [0])
    client = PerseusClient(offline=True, gpu=gpu, handle_signals=False)
    try:
        yield InstructionHooks(client), gpu
    finally:
        client.close()


def test_a_wrapped_call_runs_as_the_instruction_its_locator_names(hooked: Any) -> None:
    hooks, gpu = hooked
    seen: list[Any] = []

    def body(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        return "out"

    def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, int, int]:
        return kwargs.get("kind", "forward"), args[0], 0

    wrapped = hooks.wrap_instruction(body, locate)
    assert wrapped._perseus_hook and wrapped._perseus_owner is hooks  # type: ignore[attr-defined]
    with hooks.client.iteration():
        assert wrapped(0, kind="forward", body=None) == "out"  # any keyword passes through
        assert wrapped(0, kind="backward") == "out"
    assert seen == [((0,), {"kind": "forward", "body": None}), ((0,), {"kind": "backward"})]
    assert [r[:3] for r in executed(gpu)] == [["forward", 0, 0], ["backward", 0, 0]]


def test_a_call_that_raises_aborts_its_instruction_and_the_next_runs(hooked: Any) -> None:
    hooks, gpu = hooked

    def body(fail: bool) -> int:
        if fail:
            raise KeyError("the framework's error")
        return 7

    wrapped = hooks.wrap_instruction(body, lambda args, kwargs: ("forward", int(args[0]), 0))
    with hooks.client.iteration():
        with pytest.raises(KeyError, match="the framework's error"):
            wrapped(True)
        assert wrapped(False) == 7
    assert [r[:3] for r in executed(gpu)] == [["forward", 1, 0], ["forward", 0, 0]]


def test_inactive_hooks_run_the_call_bare(hooked: Any) -> None:
    hooks, gpu = hooked

    def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, int, int]:
        raise AssertionError("an inactive hook locates nothing")

    wrapped = hooks.wrap_instruction(lambda x: x + 1, locate)
    hooks._active = False
    assert wrapped(1) == 2
    assert executed(gpu) == []


def test_hooks_time_transfers_only_when_asked_and_the_client_can() -> None:
    class NoTransfers:
        def iteration(self) -> Any: ...
        def instruction(self, kind: str, *, microbatch: int, stage: int) -> Any: ...

    assert InstructionHooks(NoTransfers()).transfers is False
    with pytest.raises(ValueError, match="transfer_timing"):
        InstructionHooks(NoTransfers(), transfer_timing="sundial")


# --- hooks on one framework object: the constructor and the context manager, written once -----


def test_hooks_on_one_object_take_it_and_the_client_the_same_way(hooked: Any) -> None:
    from perseus_client.integrations._base import ObjectHooks
    from perseus_client.integrations.deepspeed import EngineHooks
    from perseus_client.integrations.torch_pipelining import PipelineHooks

    base, _ = hooked
    engine, schedule = object(), object()
    ds = EngineHooks(engine, base.client, transfers=False, transfer_timing="cpu")
    tp = PipelineHooks(schedule, base.client, transfer_timing="events")
    assert isinstance(ds, ObjectHooks) and isinstance(tp, ObjectHooks)
    assert ds.target is ds.engine is engine and tp.target is tp.schedule is schedule
    assert (ds.client, ds.transfers, ds.transfer_timing) == (base.client, False, "cpu")
    assert (tp.transfers, tp.transfer_timing) == (base.transfers, "events")
    assert ds._active is False and tp._active is True  # each integration's own bookkeeping
    for cls, target in ((EngineHooks, engine), (PipelineHooks, schedule)):
        with pytest.raises(ValueError, match="transfer_timing"):
            cls(target, base.client, transfer_timing="sundial")


def test_leaving_with_removes_the_hooks_even_on_an_error(hooked: Any) -> None:
    from perseus_client.integrations.torch_pipelining import PipelineHooks

    base, _ = hooked
    removed: list[str] = []

    class Recording(PipelineHooks):
        def remove(self) -> None:
            removed.append("removed")

    with pytest.raises(KeyError), Recording(object(), base.client) as hooks:
        assert isinstance(hooks, Recording)
        raise KeyError("the training loop's error")
    assert removed == ["removed"]
    with pytest.raises(NotImplementedError):
        base.remove()  # the base knows nothing to undo
