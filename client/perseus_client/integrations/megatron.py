"""Perseus hooks for Megatron-core's pipeline schedules (megatron-core 0.16).

Megatron's schedule functions (``forward_backward_no_pipelining``,
``forward_backward_pipelining_without_interleaving``,
``forward_backward_pipelining_with_interleaving``) call ``forward_step`` and ``backward_step`` by
their module-global names in ``megatron.core.pipeline_parallel.schedules``, looked up at call
time. :func:`instrument` replaces those two module attributes with wrappers that run each call
inside ``client.instruction(...)``; :meth:`MegatronHooks.remove` puts the originals back.

``backward_step`` carries no microbatch id (and ``forward_step`` no model stage without virtual
stages), so the hooks follow this rank's *order*: the k-th ``forward_step`` call of an iteration is
the k-th forward of the order, the k-th ``backward_step`` the k-th backward. Where Megatron passes
``current_microbatch`` / ``vp_stage`` the hook checks them against the order and raises on a
difference, so a wrong order cannot go unnoticed. :func:`export_orders` builds the orders exactly as
Megatron schedules them: 1F1B with ``pipeline_parallel_size - rank - 1`` warm-up forwards, and for
virtual pipelines the table of ``get_schedule_table`` with Megatron's warm-up count; model chunk
``c`` of pipeline rank ``r`` is model stage ``c * pipeline_parallel_size + r``.

Iterations: :meth:`MegatronHooks.wrap` turns the ``forward_backward_func`` into one that runs inside
``client.iteration()`` (calls with ``forward_only=True`` pass through uninstrumented).

Usage::

    from megatron.core.pipeline_parallel import get_forward_backward_func
    from perseus_client.integrations import megatron as perseus_megatron

    orders = perseus_megatron.export_orders(num_microbatches, pp_size, virtual_pipeline_size=vp)
    hooks = perseus_megatron.instrument(client, orders[pp_rank])
    forward_backward = hooks.wrap(get_forward_backward_func())
    for _ in range(steps):
        forward_backward(forward_step_func=..., data_iterator=..., model=model, ...)

The patch is process-wide (Megatron's schedules are module functions): one set of hooks at a
time. Megatron's combined-1F1B (MoE overlap) path schedules its own sub-steps and is not covered.

**Transfer timing.** When the client has ``record_transfer`` (``PerseusClient`` does), the hooks
also wrap ``P2PCommunicator._communicate`` (on the class, process-wide like the rest), through
which every send and receive of Megatron's schedules runs, and record each blocking call's time:
a send to the next rank as the forward transfer of the last forward this rank ran (boundary: its
stage), a receive from the previous rank as that of the next forward in the order (boundary: its
stage - 1), and the same for backwards (a send to the previous rank: the last backward's, at its
stage - 1; a receive from the next rank: the next backward's, at its stage). A combined call
(``send_forward_recv_backward`` and the like) gives each of its parts the call's time. Calls that
do not wait (``overlap_p2p_comm``, ``wait_on_reqs=False``) are not timed. On gloo the time runs
from the call to the end of its waits, on the CPU; on NCCL (the communicator's ``pp_group``, else
the default group) the waits only order the CUDA streams, so the call is timed by CUDA events
recorded around it (see :mod:`perseus_client.integrations._timing`; ``transfer_timing``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from perseus_client.integrations._base import (
    InstructionClient,
    InstructionHooks,
    check_orders,
    quiet_stdout,
)
from perseus_client.integrations._timing import event_factory, timed_call

if TYPE_CHECKING:
    from perseus_client.integrations._base import Orders, Where


__all__ = ["MegatronHooks", "instrument", "export_orders", "stage_order"]

_MODULE = "megatron.core.pipeline_parallel.schedules"
_P2P_MODULE = "megatron.core.pipeline_parallel.p2p_communication"


def _schedule_table(num_microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    from megatron.core.pipeline_parallel.schedules import get_schedule_table

    return [(int(m), int(c)) for m, c in get_schedule_table(num_microbatches, chunks, group)]


@quiet_stdout
def stage_order(
    num_microbatches: int,
    pipeline_parallel_size: int,
    pipeline_rank: int,
    *,
    virtual_pipeline_size: int | None = None,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> list[list[Any]]:
    """Pipeline rank ``pipeline_rank``'s ``[[kind, microbatch, stage], ...]`` as Megatron runs it.

    Args:
        num_microbatches: microbatches per iteration (Megatron's ``num_microbatches``).
        pipeline_parallel_size: pipeline ranks.
        pipeline_rank: the rank whose order this is, ``0..pipeline_parallel_size - 1``.
        virtual_pipeline_size: model chunks per rank for the interleaved schedule (``None``:
            not interleaved, 1F1B).
        microbatch_group_size_per_vp_stage: Megatron's option of that name (``None``: its
            default, ``pipeline_parallel_size``).

    Raises:
        ValueError: a size out of range, naming the argument.
    """
    pp, rank, m = int(pipeline_parallel_size), int(pipeline_rank), int(num_microbatches)
    if m < 1:
        raise ValueError(f"num_microbatches: must be >= 1, got {m}")
    if pp < 1 or not 0 <= rank < pp:
        raise ValueError(f"pipeline_rank: must be in 0..{pp - 1}, got {rank}")
    vp = 1 if virtual_pipeline_size is None else int(virtual_pipeline_size)
    if vp < 1:
        raise ValueError(f"virtual_pipeline_size: must be >= 1, got {vp}")
    if virtual_pipeline_size is None or pp == 1:
        if vp != 1:
            raise ValueError("virtual_pipeline_size: needs pipeline_parallel_size > 1")
        # forward_backward_no_pipelining (pp == 1) and ..._without_interleaving: 1F1B.
        warmup = min(pp - rank - 1, m)
        order = [["forward", i, rank] for i in range(warmup)]
        for i in range(m - warmup):
            order += [["forward", warmup + i, rank], ["backward", i, rank]]
        order += [["backward", i, rank] for i in range(m - warmup, m)]
        return order
    group = (
        pp
        if microbatch_group_size_per_vp_stage is None
        else int(microbatch_group_size_per_vp_stage)
    )
    if group < 1:
        raise ValueError(f"microbatch_group_size_per_vp_stage: must be >= 1, got {group}")
    table = _schedule_table(m, vp, group)
    total = m * vp
    warmup = min((pp - rank - 1) * 2 + (vp - 1) * group, total)

    def forward(k: int) -> list[Any]:
        mb, chunk = table[k]
        return ["forward", mb, chunk * pp + rank]

    def backward(k: int) -> list[Any]:
        mb, chunk = table[k]
        return ["backward", mb, (vp - chunk - 1) * pp + rank]

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


@quiet_stdout
def export_orders(
    num_microbatches: int,
    pipeline_parallel_size: int,
    *,
    virtual_pipeline_size: int | None = None,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> Orders:
    """Every pipeline rank's order (see :func:`stage_order`, whose arguments these are)."""
    return check_orders(
        [
            stage_order(
                num_microbatches,
                pipeline_parallel_size,
                r,
                virtual_pipeline_size=virtual_pipeline_size,
                microbatch_group_size_per_vp_stage=microbatch_group_size_per_vp_stage,
            )
            for r in range(int(pipeline_parallel_size))
        ]
    )


_UNKNOWN = object()


class MegatronHooks(InstructionHooks):
    """Megatron's ``forward_step`` / ``backward_step`` replaced by instrumented wrappers.

    Attributes:
        client: the client driven by the hooks.
        order: this rank's ``[[kind, microbatch, stage], ...]``.
        calls: instructions reported this iteration, ``(kind, microbatch, stage)``.
        transfers: whether P2P transfers are timed (see the module docstring).
    """

    def __init__(
        self,
        client: InstructionClient,
        order: Sequence[Sequence[Any]],
        *,
        transfers: bool = True,
        transfer_timing: str = "auto",
    ) -> None:
        super().__init__(client, transfers=transfers, transfer_timing=transfer_timing)
        self._p2p_class: Any = None
        self._p2p_original: Any = None
        self.order = [list(op) for op in order]
        check_orders([self.order])
        kinds = {op[0] for op in self.order}
        if kinds - {"forward", "backward"}:
            raise ValueError("order: Megatron schedules run only forward and backward instructions")
        self._forwards = [op for op in self.order if op[0] == "forward"]
        self._backwards = [op for op in self.order if op[0] == "backward"]
        # model stage -> model chunk (vp_stage) on this rank.
        self._chunk = {s: c for c, s in enumerate(sorted({op[2] for op in self.order}))}
        self._nf = 0
        self._nb = 0
        self._module: Any = None
        self._originals: dict[str, Any] = {}
        self.calls: list[tuple[str, int, int]] = []

    # -- installation ---------------------------------------------------------------------------

    def install(self) -> MegatronHooks:
        """Patch Megatron's step functions to drive the client; returns ``self``.

        Raises ``RuntimeError`` when they are already patched.
        """
        import importlib

        module: Any = importlib.import_module(_MODULE)
        for name in ("forward_step", "backward_step"):
            if getattr(getattr(module, name), "_perseus_hook", False):
                raise RuntimeError(
                    f"{_MODULE}.{name} already carries Perseus hooks; remove them first"
                )
        self._module = module
        self._originals = {
            "forward_step": module.forward_step,
            "backward_step": module.backward_step,
        }
        module.forward_step = self._wrap_forward(self._originals["forward_step"])
        module.backward_step = self._wrap_backward(self._originals["backward_step"])
        if self._record is not None:
            cls = importlib.import_module(_P2P_MODULE).P2PCommunicator
            self._p2p_class, self._p2p_original = cls, cls.__dict__["_communicate"]
            cls._communicate = self._wrap_communicate(self._p2p_original)
        return self

    def remove(self) -> None:
        """Put Megatron's original functions back (only if ours are still installed)."""
        module = self._module
        if module is None:
            return
        for name, original in self._originals.items():
            if getattr(getattr(module, name), "_perseus_owner", None) is self:
                setattr(module, name, original)
        cls = self._p2p_class
        if cls is not None and getattr(cls._communicate, "_perseus_owner", None) is self:
            cls._communicate = self._p2p_original
        self._p2p_class = self._p2p_original = None
        self._module = None
        self._originals = {}

    # -- iterations -----------------------------------------------------------------------------

    def start_iteration(self) -> None:
        """Restart the counters.

        Done by :meth:`wrap`'s function; call it if you mark iterations with
        ``client.iteration()`` yourself.
        """
        self._nf = 0
        self._nb = 0
        self.calls = []

    def wrap(self, forward_backward_func: Callable[..., Any]) -> Callable[..., Any]:
        """``forward_backward_func`` running inside ``client.iteration()``."""

        @functools.wraps(forward_backward_func)
        def perseus_forward_backward(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("forward_only", False):
                self._active = False
                try:
                    return forward_backward_func(*args, **kwargs)
                finally:
                    self._active = True
            self.start_iteration()
            with self.client.iteration():
                return forward_backward_func(*args, **kwargs)

        return perseus_forward_backward

    # -- wrappers -------------------------------------------------------------------------------

    def _next(self, kind: str) -> list[Any]:
        ops = self._forwards if kind == "forward" else self._backwards
        k = self._nf if kind == "forward" else self._nb
        if k >= len(ops):
            raise RuntimeError(
                f"megatron: {kind} call #{k + 1} of this iteration, but the order has only "
                f"{len(ops)} {kind}s (was the iteration started with hooks.wrap / start_iteration?)"
            )
        if kind == "forward":
            self._nf += 1
        else:
            self._nb += 1
        return ops[k]

    def _wrap_forward(self, forward_step: Callable[..., Any]) -> Callable[..., Any]:
        def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Where:
            _, mb, stage = self._next("forward")
            current = kwargs.get("current_microbatch")
            vp_stage = kwargs.get("vp_stage")
            if current is not None and int(current) != mb:
                raise RuntimeError(
                    f"megatron: forward_step runs microbatch {current} where the order has "
                    f"forward of microbatch {mb} on stage {stage}"
                )
            if vp_stage is not None and int(vp_stage) != self._chunk[stage]:
                raise RuntimeError(
                    f"megatron: forward_step runs model chunk {vp_stage} where the order has "
                    f"stage {stage} (chunk {self._chunk[stage]})"
                )
            self.calls.append(("forward", mb, stage))
            return "forward", mb, stage

        return self.wrap_instruction(forward_step, locate)

    def _wrap_communicate(self, communicate: Callable[..., Any]) -> Callable[..., Any]:
        record = self._record
        assert record is not None
        forwards, backwards = self._forwards, self._backwards

        makers: dict[int, Any] = {}

        @functools.wraps(communicate)
        def perseus_communicate(comm: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._active or not kwargs.get("wait_on_reqs", True):
                return communicate(comm, *args, **kwargs)
            make_event = makers.get(id(comm), _UNKNOWN)
            if make_event is _UNKNOWN:  # once per communicator: its group's backend
                make_event = makers[id(comm)] = event_factory(
                    getattr(comm, "pp_group", None), self.transfer_timing
                )
            result, seconds = timed_call(make_event, communicate, comm, *args, **kwargs)
            nf, nb = self._nf, self._nb
            if kwargs.get("tensor_send_next") is not None and nf > 0:
                _, mb, stage = forwards[nf - 1]
                record(stage, "forward", mb, seconds)
            if kwargs.get("recv_prev") and nf < len(forwards):
                _, mb, stage = forwards[nf]
                record(stage - 1, "forward", mb, seconds)
            if kwargs.get("tensor_send_prev") is not None and nb > 0:
                _, mb, stage = backwards[nb - 1]
                record(stage - 1, "backward", mb, seconds)
            if kwargs.get("recv_next") and nb < len(backwards):
                _, mb, stage = backwards[nb]
                record(stage, "backward", mb, seconds)
            return result

        perseus_communicate._perseus_hook = True  # type: ignore[attr-defined]
        perseus_communicate._perseus_owner = self  # type: ignore[attr-defined]
        return perseus_communicate

    def _wrap_backward(self, backward_step: Callable[..., Any]) -> Callable[..., Any]:
        def locate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Where:
            _, mb, stage = self._next("backward")
            self.calls.append(("backward", mb, stage))
            return "backward", mb, stage

        return self.wrap_instruction(backward_step, locate)


@quiet_stdout
def instrument(
    client: InstructionClient,
    order: Sequence[Sequence[Any]],
    *,
    transfers: bool = True,
    transfer_timing: str = "auto",
) -> MegatronHooks:
    """Patch Megatron's ``forward_step`` / ``backward_step`` to drive ``client`` along ``order``.

    Args:
        client: what the hooks call: ``iteration()`` and ``instruction(kind, microbatch=,
            stage=)``, e.g. a ``PerseusClient``.
        order: this rank's entry of :func:`export_orders`.
        transfers: also time the P2P calls (when the client has ``record_transfer``; see the
            module docstring).
        transfer_timing: ``"auto"`` (CUDA events on NCCL, the CPU otherwise), ``"events"`` or
            ``"cpu"`` (see :mod:`perseus_client.integrations._timing`).
    """
    if not isinstance(client, InstructionClient):
        raise TypeError("client: needs iteration() and instruction(kind, microbatch=, stage=)")
    return MegatronHooks(
        client, order, transfers=transfers, transfer_timing=transfer_timing
    ).install()
