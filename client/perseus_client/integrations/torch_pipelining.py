"""Perseus hooks for ``torch.distributed.pipelining`` schedules.

Every schedule in ``torch.distributed.pipelining`` (GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, and custom CSV schedules) runs its computation
through three methods of the stage objects it holds:

* ``forward_one_chunk(mb, ...)`` — a forward (``forward``);
* ``backward_one_chunk(mb, ..., full_backward=True)`` — a full backward (``backward``), or with
  ``full_backward=False`` the input-gradient half of a split backward (``backward_input``);
* ``backward_weight_one_chunk(mb, ...)`` — the weight-gradient half (``backward_weight``).

:func:`instrument` wraps those methods on the schedule's stage *instances* (the classes are left
alone, so other pipelines in the process are unaffected) so that each call runs inside
``client.instruction(kind, microbatch=mb, stage=stage.stage_index)``, and wraps
``schedule.step`` in ``client.iteration()``. Forward-only calls (``schedule.eval``) are not
instrumented: they are not part of the training iteration the plan describes.

:func:`export_orders` gives the whole pipeline's per-rank order (every rank computes the same
result, so any rank may send it when the job is created). Multi-stage schedules run the compute
actions of ``schedule.pipeline_order_with_comms`` in order, so the export reads those (with
``OVERLAP_F_B`` actions expanded into their sub-actions). Single-stage GPipe and 1F1B run
hand-written loops whose order torch's ``pipeline_order`` does not reproduce faithfully (in torch
2.13 ``Schedule1F1B._get_pipeline_order`` gives the last rank wrong microbatch indices), so their
orders come from :func:`perseus_common.orders.gpipe_orders` / :func:`~perseus_common.orders.one_f_one_b_orders`, which
match what the loops execute (the integration tests check this against real runs).

Usage::

    from perseus_client.integrations import torch_pipelining

    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=8, loss_fn=loss_fn)
    orders = torch_pipelining.export_orders(schedule)   # job's schedule: {"name": "custom", ...}
    with torch_pipelining.instrument(schedule, client):
        for batch, target in loader:
            schedule.step(batch, target=target)

**Transfer timing.** When the client has ``record_transfer(boundary, direction, microbatch,
seconds)`` (``PerseusClient`` does), the hooks also time the P2P transfers the schedule runs: the
stages' ``get_{fwd,bwd}_{send,recv}_ops`` tag the ops they return, and the schedules' module
functions that post and wait on P2P ops note the time from posting to the end of the wait (see
:mod:`perseus_client.integrations._torch_p2p` for what that time means: each end measures the
transfer plus the other end's lateness, so the smaller of its two ends' values is the transfer).
A stage ``s`` records its forward send and backward receive at boundary ``s`` and its forward
receive and backward send at boundary ``s - 1``; transfers between two stages on one rank (no
P2P op) are not recorded. ``instrument(..., transfers=False)`` leaves them alone.

Overhead: the client's ``begin`` / ``end`` per instruction on the training thread and, with
transfer timing, one attribute write per P2P op (its tag built once per microbatch), one clock
read when the ops are posted and one when their wait returns; no synchronisation (benchmark:
``benchmarks/hooks.py``). Custom per-action functions registered through ``register_custom_function`` bypass the stage
methods and are not seen by these hooks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perseus_client.integrations import _torch_p2p
from perseus_client.integrations._base import (
    InstructionClient,
    ObjectHooks,
    check_orders,
    quiet_stdout,
)
from perseus_client.integrations._timing import event_factory
from perseus_common.orders import gpipe_orders, one_f_one_b_orders

if TYPE_CHECKING:
    from perseus_client.integrations._base import Orders, Where


__all__ = [
    "PipelineHooks",
    "instrument",
    "export_orders",
    "orders_for",
    "schedule_stages",
    "COMPUTATION_KINDS",
]

#: torch's compute action types (``_ComputationType`` values) -> Perseus instruction kinds.
COMPUTATION_KINDS = {
    "F": "forward",
    "B": "backward",
    "I": "backward_input",
    "W": "backward_weight",
}

_STAGE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")

#: The stage methods that build P2P ops -> (boundary offset from the stage index, direction).
_P2P_METHODS = {
    "get_fwd_send_ops": (0, "forward"),
    "get_fwd_recv_ops": (-1, "forward"),
    "get_bwd_send_ops": (-1, "backward"),
    "get_bwd_recv_ops": (0, "backward"),
}


def schedule_stages(schedule: Any) -> list[Any]:
    """The stage objects a schedule drives on this rank (one for single-stage schedules)."""
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stage = getattr(schedule, "_stage", None)
        if stage is None:
            raise TypeError(
                f"schedule: {type(schedule).__name__} is not a torch.distributed.pipelining "
                "schedule (it holds neither _stage nor _stages)"
            )
        stages = [stage]
    return list(stages)


def _chunk_id(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> int:
    """The microbatch a stage method is called for: its first argument, however passed."""
    return int(args[0] if args else kwargs[name])


def _full_backward(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, last_backward=False);
    # ``args`` here excludes bwd_chunk_id.
    if "full_backward" in kwargs:
        return bool(kwargs["full_backward"])
    return bool(args[1]) if len(args) > 1 else True


class PipelineHooks(ObjectHooks):
    """Installed hooks on one schedule; :meth:`remove` (or leaving the ``with``) uninstalls them.

    ``PipelineHooks(schedule, client, *, transfers=True, transfer_timing="auto")``, as
    :class:`~perseus_client.integrations._base.ObjectHooks`.

    Attributes:
        schedule: the instrumented schedule.
        client: the client whose context managers wrap each instruction.
        transfers: whether P2P transfers are timed (the client has ``record_transfer`` and
            ``instrument`` was not told ``transfers=False``).
    """

    @property
    def schedule(self) -> Any:
        """The instrumented schedule."""
        return self.target

    def _prepare(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._installed = False
        self._p2p = False

    # -- installation ---------------------------------------------------------------------------

    def _patch(self, obj: Any, name: str, replacement: Callable[..., Any]) -> None:
        # Remember an instance-level attribute if there was one (another wrapper), else restore the
        # class attribute on removal by deleting ours.
        self._saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, replacement)

    def install(self) -> PipelineHooks:
        """Install the hooks on every stage of the schedule; returns ``self``.

        Raises ``RuntimeError`` when they are already installed.
        """
        if self._installed:
            raise RuntimeError("hooks: already installed on this schedule")
        for stage in schedule_stages(self.schedule):
            if any(
                getattr(getattr(stage, m, None), "_perseus_hook", False) for m in _STAGE_METHODS
            ):
                raise RuntimeError(
                    f"schedule: stage {stage.stage_index} already carries Perseus hooks; "
                    "remove the other instrumentation first"
                )
            self._patch(stage, "forward_one_chunk", self._wrap_forward(stage))
            self._patch(stage, "backward_one_chunk", self._wrap_backward(stage))
            self._patch(stage, "backward_weight_one_chunk", self._wrap_backward_weight(stage))
            if self._record is not None:
                for name, (offset, direction) in _P2P_METHODS.items():
                    if hasattr(stage, name):
                        self._patch(stage, name, self._wrap_ops(stage, name, offset, direction))
        self._patch(self.schedule, "step", self._wrap_step(self.schedule.step))
        if self._record is not None:
            _torch_p2p.acquire()
            self._p2p = True
        self._installed = True
        return self

    def remove(self) -> None:
        """Restore every patched method; safe to call twice."""
        while self._saved:
            obj, name, previous = self._saved.pop()
            if previous is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                setattr(obj, name, previous)
        if self._p2p:
            self._p2p = False
            _torch_p2p.release()
        self._installed = False

    # -- wrappers -------------------------------------------------------------------------------

    def _wrap_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(step)
        def perseus_step(*args: Any, **kwargs: Any) -> Any:
            if not getattr(self.schedule, "_has_backward", True):
                # schedule.eval(): forward only, not the iteration the plan describes.
                self._active = False
                try:
                    return step(*args, **kwargs)
                finally:
                    self._active = True
            with self.client.iteration():
                return step(*args, **kwargs)

        perseus_step._perseus_hook = True  # type: ignore[attr-defined]
        return perseus_step

    def _wrap_ops(self, stage: Any, name: str, offset: int, direction: str) -> Callable[..., Any]:
        original = getattr(stage, name)
        boundary = int(stage.stage_index) + offset
        record = self._record
        tag_name = _torch_p2p.TAG
        make_event = event_factory(getattr(stage, "group", None), self.transfer_timing)

        tags: dict[int, Any] = {}  # per microbatch, its tag (built once)

        @functools.wraps(original)
        def p2p_ops(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            ops = original(chunk_id, *args, **kwargs)
            if ops and self._active:
                tag = tags.get(chunk_id)
                if tag is None:
                    tag = tags[chunk_id] = (record, boundary, direction, int(chunk_id), make_event)
                for op in ops:
                    setattr(op, tag_name, tag)
            return ops

        p2p_ops._perseus_hook = True  # type: ignore[attr-defined]
        return p2p_ops

    def _wrap_forward(self, stage: Any) -> Callable[..., Any]:
        index = int(stage.stage_index)

        def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Where:
            return "forward", _chunk_id(args, kwargs, "fwd_chunk_id"), index

        return self.wrap_instruction(stage.forward_one_chunk, locate)

    def _wrap_backward(self, stage: Any) -> Callable[..., Any]:
        index = int(stage.stage_index)

        def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Where:
            kind = "backward" if _full_backward(args[1:], kwargs) else "backward_input"
            return kind, _chunk_id(args, kwargs, "bwd_chunk_id"), index

        return self.wrap_instruction(stage.backward_one_chunk, locate)

    def _wrap_backward_weight(self, stage: Any) -> Callable[..., Any]:
        index = int(stage.stage_index)

        def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Where:
            return "backward_weight", _chunk_id(args, kwargs, "bwd_chunk_id"), index

        return self.wrap_instruction(stage.backward_weight_one_chunk, locate)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


@quiet_stdout
def instrument(
    schedule: Any,
    client: InstructionClient,
    *,
    transfers: bool = True,
    transfer_timing: str = "auto",
) -> PipelineHooks:
    """Hook ``client`` into ``schedule`` (a ``torch.distributed.pipelining`` schedule).

    ``transfers``: also time the schedule's P2P transfers (when the client has
    ``record_transfer``; see the module docstring); ``transfer_timing``: ``"auto"`` (CUDA events
    when the stage's process group is NCCL, else the CPU), ``"cpu"`` or ``"events"`` (see
    :mod:`perseus_client.integrations._timing`). Returns the installed
    :class:`PipelineHooks`; use it as a context manager or call :meth:`PipelineHooks.remove` to
    uninstall.
    """
    if not isinstance(client, InstructionClient):
        raise TypeError("client: needs iteration() and instruction(kind, microbatch=, stage=)")
    return PipelineHooks(
        schedule, client, transfers=transfers, transfer_timing=transfer_timing
    ).install()


def _action_ops(action: Any) -> list[list[Any]]:
    """The Perseus ops of one torch ``_Action`` (none for communication / resharding actions)."""
    if action is None:
        return []
    subs = getattr(action, "sub_actions", None)
    if subs:
        return [op for sub in subs for op in _action_ops(sub)]
    kind = COMPUTATION_KINDS.get(str(getattr(action.computation_type, "value", "")))
    if kind is None:
        return []
    if action.microbatch_index is None:
        raise ValueError(f"schedule: compute action {action!r} has no microbatch index")
    return [[kind, int(action.microbatch_index), int(action.stage_index)]]


@quiet_stdout
def export_orders(schedule: Any) -> Orders:
    """The exact per-rank order ``[[kind, microbatch, stage], ...]`` the schedule executes.

    Works on any rank (every rank computes the whole pipeline's order). Raises ``TypeError`` for a
    schedule whose order cannot be derived (a single-stage schedule other than GPipe / 1F1B).
    """
    from torch.distributed.pipelining.schedules import (
        PipelineScheduleSingle,
        Schedule1F1B,
        ScheduleGPipe,
    )

    if isinstance(schedule, PipelineScheduleSingle):
        stages = int(schedule._num_stages)
        microbatches = int(schedule._n_microbatches)
        if isinstance(schedule, Schedule1F1B):
            built = one_f_one_b_orders(stages, microbatches)
        elif isinstance(schedule, ScheduleGPipe):
            built = gpipe_orders(stages, microbatches)
        else:
            raise TypeError(
                f"schedule: no order known for single-stage schedule {type(schedule).__name__}"
            )
        return check_orders(_lists(built))
    table = getattr(schedule, "pipeline_order_with_comms", None) or getattr(
        schedule, "pipeline_order", None
    )
    if not table:
        raise TypeError(f"schedule: {type(schedule).__name__} exposes no pipeline_order")
    orders = [
        [op for action in table[rank] for op in _action_ops(action)] for rank in sorted(table)
    ]
    return check_orders(orders)


@quiet_stdout
def orders_for(
    schedule: str | type,
    ranks: int,
    microbatches: int,
    stages_per_rank: int | None = None,
) -> Orders:
    """The per-rank order of a schedule class, without building stages or a process group.

    The class may be given by name, as ``get_schedule_class`` takes it; e.g. to create the job
    before launching the ranks.

    Single-stage GPipe / 1F1B come from :mod:`perseus_common.orders` (see the module docstring); the
    others from ``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops`` with the
    communication lowering the runtime executes. ``stages_per_rank`` defaults to torch's (1 for
    single-stage schedules, 2 otherwise).
    """
    from torch.distributed.pipelining import schedules as tsched
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    cls = tsched.get_schedule_class(schedule) if isinstance(schedule, str) else schedule
    if issubclass(cls, tsched.PipelineScheduleSingle):
        if stages_per_rank not in (None, 1):
            raise ValueError(f"stages_per_rank: {cls.__name__} holds one stage per rank")
        if issubclass(cls, tsched.Schedule1F1B):
            return check_orders(_lists(one_f_one_b_orders(ranks, microbatches)))
        if issubclass(cls, tsched.ScheduleGPipe):
            return check_orders(_lists(gpipe_orders(ranks, microbatches)))
        raise TypeError(f"schedule: no order known for single-stage schedule {cls.__name__}")
    table = get_schedule_ops(cls, ranks, microbatches, stages_per_rank, with_comms=True)
    return check_orders([[op for action in rank for op in _action_ops(action)] for rank in table])


def _lists(orders: list[list[tuple[str, int, int]]]) -> Orders:
    return [[list(op) for op in order] for order in orders]
