"""Perseus hooks for DeepSpeed's ``PipelineEngine`` (``TrainSchedule``, 1F1B).

``PipelineEngine._exec_schedule`` looks every instruction up in ``self._INSTRUCTION_MAP``, a class
attribute holding the *original* functions, so patching ``PipelineEngine._exec_forward_pass`` has no
effect. :func:`instrument` gives the engine instance its own copy of the map in which
``ForwardPass`` and ``BackwardPass`` run inside ``client.instruction(...)``, and wraps the
instance's ``train_batch`` in ``client.iteration()``. Other engines in the process are untouched.

A ``ForwardPass`` / ``BackwardPass`` carries ``buffer_id``, a pipeline buffer *slot* reused
round-robin, not a microbatch id. ``TrainSchedule`` runs each stage's forwards, and its backwards,
in microbatch order, so the hook counts them within the iteration (the k-th forward is microbatch
k); :func:`export_orders` derives the order the same way from ``TrainSchedule`` and checks that the
counted microbatches land in the buffer slots the schedule names. Instructions outside
``train_batch`` (``eval_batch``) are not instrumented.

**Transfer timing.** When the client has ``record_transfer`` (``PerseusClient`` does), the hooks
also time the engine's P2P instructions, which DeepSpeed runs as blocking sends and receives:
``SendActivation`` and ``RecvGrad`` of stage ``s`` at boundary ``s``, ``RecvActivation`` and
``SendGrad`` at boundary ``s - 1``; the k-th of each kind in an iteration is microbatch k (as for
the passes). Each end measures the transfer plus its wait for the other end, so the smaller of a
transfer's two ends' values is the transfer itself; the first iteration's first send also carries
DeepSpeed's tensor-metadata exchange. ``instrument(..., transfers=False)`` leaves them alone.
On NCCL (the default process group's backend) each P2P instruction is timed by CUDA events
recorded around it instead of the CPU (``transfer_timing``, see
:mod:`perseus_client.integrations._timing`).

Usage::

    from perseus_client.integrations import deepspeed as perseus_ds

    engine, _, _, _ = deepspeed.initialize(model=pipeline_module, config=ds_config, ...)
    orders = perseus_ds.export_orders(engine.micro_batches, engine.num_stages)
    with perseus_ds.instrument(engine, client):
        for _ in range(steps):
            engine.train_batch(data_iter)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perseus_client.integrations._base import (
    InstructionClient,
    ObjectHooks,
    check_orders,
    quiet_stdout,
)
from perseus_client.integrations._timing import event_factory, timed_call

if TYPE_CHECKING:
    from perseus_client.integrations._base import Orders, Where


__all__ = ["EngineHooks", "instrument", "export_orders", "stage_order"]


@quiet_stdout
def stage_order(micro_batches: int, stages: int, stage_id: int) -> list[list[Any]]:
    """One stage's ``[[kind, microbatch, stage], ...]`` as ``TrainSchedule`` runs it."""
    from deepspeed.runtime.pipe import schedule as ds_schedule

    if micro_batches < 1 or stages < 1 or not 0 <= stage_id < stages:
        raise ValueError(
            f"micro_batches, stages, stage_id: need micro_batches >= 1 and 0 <= stage_id < stages, "
            f"got {micro_batches}, {stages}, {stage_id}"
        )
    sched = ds_schedule.TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=stage_id)
    buffers = sched.num_pipe_buffers()
    order: list[list[Any]] = []
    counts = {"forward": 0, "backward": 0}
    for step in sched:
        for cmd in step:
            if isinstance(cmd, ds_schedule.ForwardPass):
                kind = "forward"
            elif isinstance(cmd, ds_schedule.BackwardPass):
                kind = "backward"
            else:
                continue
            mb = counts[kind]
            counts[kind] += 1
            if cmd.buffer_id != mb % buffers:
                raise RuntimeError(
                    f"TrainSchedule: stage {stage_id}'s {kind} #{mb} uses buffer {cmd.buffer_id}, "
                    f"not {mb % buffers}; its microbatches are not in order"
                )
            order.append([kind, mb, stage_id])
    return order


@quiet_stdout
def export_orders(micro_batches: int, stages: int) -> Orders:
    """Every stage's order under ``TrainSchedule`` (no process group needed)."""
    return check_orders([stage_order(micro_batches, stages, s) for s in range(stages)])


class EngineHooks(ObjectHooks):
    """Hooks installed on one ``PipelineEngine``; :meth:`remove` (or leaving ``with``) undoes them.

    ``EngineHooks(engine, client, *, transfers=True, transfer_timing="auto")``, as
    :class:`~perseus_client.integrations._base.ObjectHooks`. Whether P2P transfers are timed:
    ``transfers`` (see the module docstring).
    """

    @property
    def engine(self) -> Any:
        """The instrumented ``PipelineEngine``."""
        return self.target

    def _prepare(self) -> None:
        self._counts = {"forward": 0, "backward": 0}
        self._p2p_counts = [0, 0, 0, 0]
        self._active = False
        self._saved: dict[str, Any] = {}

    def install(self) -> EngineHooks:
        """Install the hooks on the engine's pipeline instructions; returns ``self``.

        Raises ``RuntimeError`` when the engine is already instrumented.
        """
        from deepspeed.runtime.pipe import schedule as ds_schedule

        engine = self.engine
        if "_INSTRUCTION_MAP" in vars(engine) or "train_batch" in vars(engine):
            raise RuntimeError("engine: already instrumented (remove the other hooks first)")
        table = dict(type(engine)._INSTRUCTION_MAP)
        stage = int(engine.stage_id)
        table[ds_schedule.ForwardPass] = self._wrap(
            table[ds_schedule.ForwardPass], "forward", stage
        )
        table[ds_schedule.BackwardPass] = self._wrap(
            table[ds_schedule.BackwardPass], "backward", stage
        )
        if self._record is not None:
            for slot, (cmd, boundary, direction) in enumerate(
                (
                    (ds_schedule.SendActivation, stage, "forward"),
                    (ds_schedule.RecvActivation, stage - 1, "forward"),
                    (ds_schedule.SendGrad, stage - 1, "backward"),
                    (ds_schedule.RecvGrad, stage, "backward"),
                )
            ):
                table[cmd] = self._wrap_p2p(table[cmd], slot, boundary, direction)
        train_batch = engine.train_batch

        @functools.wraps(train_batch)
        def perseus_train_batch(*args: Any, **kwargs: Any) -> Any:
            self._counts = {"forward": 0, "backward": 0}
            self._p2p_counts = [0, 0, 0, 0]
            with self.client.iteration():
                self._active = True
                try:
                    return train_batch(*args, **kwargs)
                finally:
                    self._active = False

        engine._INSTRUCTION_MAP = table
        engine.train_batch = perseus_train_batch
        self._saved = {"_INSTRUCTION_MAP": table, "train_batch": perseus_train_batch}
        return self

    def _wrap(self, method: Callable[..., Any], kind: str, stage: int) -> Callable[..., Any]:
        def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Where:
            mb = self._counts[kind]  # the engine runs a stage's microbatches in order
            self._counts[kind] = mb + 1
            return kind, mb, stage

        return self.wrap_instruction(method, locate)

    def _wrap_p2p(
        self, method: Callable[..., Any], slot: int, boundary: int, direction: str
    ) -> Callable[..., Any]:
        record = self._record
        assert record is not None
        make_event = event_factory(None, self.transfer_timing)

        @functools.wraps(method)
        def perseus_p2p(engine: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._active:
                return method(engine, *args, **kwargs)
            counts = self._p2p_counts
            mb = counts[slot]
            counts[slot] = mb + 1
            result, seconds = timed_call(make_event, method, engine, *args, **kwargs)
            record(boundary, direction, mb, seconds)
            return result

        return perseus_p2p

    def remove(self) -> None:
        """Give the engine back its class's instruction map and ``train_batch``."""
        for name, ours in self._saved.items():
            if vars(self.engine).get(name) is ours:
                delattr(self.engine, name)
        self._saved = {}


@quiet_stdout
def instrument(
    engine: Any, client: InstructionClient, *, transfers: bool = True, transfer_timing: str = "auto"
) -> EngineHooks:
    """Hook ``client`` into a DeepSpeed ``PipelineEngine``; returns the installed hooks.

    Args:
        engine: the ``PipelineEngine`` whose instructions drive ``client``.
        client: what the hooks call: ``iteration()`` and ``instruction(kind, microbatch=,
            stage=)``, e.g. a ``PerseusClient``.
        transfers: also time the engine's P2P instructions (when the client has
            ``record_transfer``; see the module docstring).
        transfer_timing: ``"auto"`` (CUDA events on NCCL, the CPU otherwise), ``"events"`` or
            ``"cpu"`` (see :mod:`perseus_client.integrations._timing`).

    Raises:
        TypeError: ``engine`` is not a ``PipelineEngine``, or ``client`` lacks those calls.
        ValueError: an unknown ``transfer_timing``.
    """
    if not isinstance(client, InstructionClient):
        raise TypeError("client: needs iteration() and instruction(kind, microbatch=, stage=)")
    if not hasattr(type(engine), "_INSTRUCTION_MAP"):
        raise TypeError(f"engine: {type(engine).__name__} is not a DeepSpeed PipelineEngine")
    return EngineHooks(
        engine, client, transfers=transfers, transfer_timing=transfer_timing
    ).install()
