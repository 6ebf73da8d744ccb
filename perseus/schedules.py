"""Pipeline schedules: the order in which every pipeline rank runs its instructions.

A :class:`Schedule` lists, per rank, the :class:`Op` s it runs in order. An op is one
instruction kind on one microbatch of one *model stage*; with interleaved (virtual) stages a rank
holds several model stages (Megatron places model stage ``v * S + s`` on rank ``s``).

Built-in orders:

* :func:`gpipe` — every forward, then every backward.
* :func:`one_f_one_b` — Megatron-LM / DeepSpeed 1F1B: rank ``s`` runs ``min(S - s - 1, M)`` warm-up
  forwards, then alternates one forward and one backward, then drains the remaining backwards.
* :func:`interleaved_1f1b` — Megatron-LM's interleaved 1F1B with ``V`` model chunks per rank.
* :meth:`Schedule.from_orders` — any order, e.g. exported from ``torch.distributed.pipelining``
  or DeepSpeed's ``TrainSchedule``; validated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from perseus.errors import ScheduleError
from perseus_common.kinds import INSTRUCTION_KINDS
from perseus_common.orders import (
    Orders,
    gpipe_orders,
    interleaved_1f1b_orders,
    one_f_one_b_orders,
)

__all__ = [
    "Op",
    "Schedule",
    "SCHEDULE_NAMES",
    "gpipe",
    "one_f_one_b",
    "interleaved_1f1b",
    "make_schedule",
]

#: Upper bounds that keep a job's DAG a sane size.
MAX_RANKS = 1024
MAX_MICROBATCHES = 4096
MAX_INSTRUCTIONS = 200_000


class Op(NamedTuple):
    """One instruction: ``kind`` of ``microbatch`` on model stage ``stage``."""

    kind: str
    microbatch: int
    stage: int


@dataclass(frozen=True)
class Schedule:
    """Per-rank instruction orders of one pipeline.

    Attributes:
        name: schedule name (``gpipe``, ``1f1b``, ``interleaved-1f1b`` or ``custom``).
        ranks: number of pipeline ranks (GPUs in one pipeline).
        stages: number of model stages (``ranks * virtual_stages``).
        microbatches: microbatches per iteration.
        orders: ``orders[r]`` is rank ``r``'s ops in execution order.
    """

    name: str
    ranks: int
    stages: int
    microbatches: int
    orders: tuple[tuple[Op, ...], ...]

    @property
    def virtual_stages(self) -> int:
        """Model stages per rank (1 unless interleaved)."""
        return self.stages // self.ranks

    @property
    def num_instructions(self) -> int:
        """The number of instructions over all ranks."""
        return sum(len(o) for o in self.orders)

    def stage_rank(self) -> dict[int, int]:
        """Model stage -> the rank that runs it."""
        return {op.stage: r for r, order in enumerate(self.orders) for op in order}

    def to_json(self) -> dict[str, object]:
        """The schedule as JSON: name, sizes and every rank's order of ops."""
        return {
            "name": self.name,
            "ranks": self.ranks,
            "stages": self.stages,
            "microbatches": self.microbatches,
            "orders": [
                [[op.kind, op.microbatch, op.stage] for op in order] for order in self.orders
            ],
        }

    @classmethod
    def from_json(cls, obj: dict[str, object]) -> Schedule:
        """Parse a schedule from :meth:`to_json`'s form.

        Raises :class:`ScheduleError` naming what is malformed.
        """
        orders = obj.get("orders")
        if not isinstance(orders, list):
            raise ScheduleError("'orders' must be a list with one list of ops per rank")
        parsed = []
        for r, order in enumerate(orders):
            if not isinstance(order, list):
                raise ScheduleError(f"orders[{r}] must be a list of ops")
            ops = []
            for i, op in enumerate(order):
                if isinstance(op, dict):
                    op = [
                        op.get("instruction", op.get("kind")),
                        op.get("microbatch"),
                        op.get("stage", r),
                    ]
                if not isinstance(op, list | tuple) or len(op) not in (2, 3):
                    raise ScheduleError(
                        f"orders[{r}][{i}] must be [instruction, microbatch] or [instruction, microbatch, stage]"
                    )
                kind, mb = op[0], op[1]
                stage = op[2] if len(op) == 3 else r
                if not isinstance(mb, int) or not isinstance(stage, int) or isinstance(mb, bool):
                    raise ScheduleError(f"orders[{r}][{i}]: microbatch and stage must be integers")
                ops.append(Op(str(kind), mb, stage))
            parsed.append(ops)
        name = obj.get("name", "custom")
        return cls.from_orders(parsed, name=str(name))

    @classmethod
    def from_orders(
        cls, orders: Sequence[Iterable[Op | tuple[str, int, int]]], *, name: str = "custom"
    ) -> Schedule:
        """Validate an arbitrary per-rank order.

        Every model stage must live on one rank; every (stage, microbatch) must have exactly one
        forward and either one ``backward`` or one ``backward_input`` and one
        ``backward_weight``; microbatches must be numbered ``0..M-1`` and stages ``0..N-1``.
        Whether the order can run without deadlock is checked when the DAG is built.
        """
        ops_by_rank = tuple(tuple(Op(*op) for op in order) for order in orders)
        ranks = len(ops_by_rank)
        if ranks == 0:
            raise ScheduleError("a schedule needs at least one rank")
        if ranks > MAX_RANKS:
            raise ScheduleError(f"at most {MAX_RANKS} ranks per pipeline, got {ranks}")
        total = sum(len(o) for o in ops_by_rank)
        if total > MAX_INSTRUCTIONS:
            raise ScheduleError(f"at most {MAX_INSTRUCTIONS} instructions, got {total}")
        seen: set[Op] = set()
        stage_rank: dict[int, int] = {}
        for r, order in enumerate(ops_by_rank):
            if not order:
                raise ScheduleError(f"rank {r} runs no instruction")
            for op in order:
                if op.kind not in INSTRUCTION_KINDS:
                    raise ScheduleError(
                        f"rank {r}: unknown instruction {op.kind!r}; expected one of {', '.join(INSTRUCTION_KINDS)}"
                    )
                if op.microbatch < 0 or op.stage < 0:
                    raise ScheduleError(f"rank {r}: negative microbatch or stage in {tuple(op)}")
                if op in seen:
                    raise ScheduleError(
                        f"rank {r}: {op.kind} of microbatch {op.microbatch} on stage {op.stage} appears twice"
                    )
                seen.add(op)
                if stage_rank.setdefault(op.stage, r) != r:
                    raise ScheduleError(
                        f"stage {op.stage} appears on ranks {stage_rank[op.stage]} and {r}"
                    )
        stages = max(stage_rank) + 1
        if sorted(stage_rank) != list(range(stages)):
            raise ScheduleError(f"model stages must be numbered 0..{stages - 1}")
        microbatches = max(op.microbatch for op in seen) + 1
        for s in range(stages):
            for m in range(microbatches):
                if Op("forward", m, s) not in seen:
                    raise ScheduleError(f"stage {s} has no forward of microbatch {m}")
                full = Op("backward", m, s) in seen
                split = Op("backward_input", m, s) in seen, Op("backward_weight", m, s) in seen
                if full == any(split) or (any(split) and not all(split)):
                    raise ScheduleError(
                        f"stage {s} microbatch {m} needs one backward, or one backward_input and one backward_weight"
                    )
        if stages % ranks:
            raise ScheduleError(f"{stages} model stages do not split evenly over {ranks} ranks")
        return cls(name, ranks, stages, microbatches, ops_by_rank)


def _check_sizes(stages: int, microbatches: int) -> None:
    if not (1 <= stages <= MAX_RANKS):
        raise ScheduleError(f"stages must be between 1 and {MAX_RANKS}, got {stages}")
    if not (1 <= microbatches <= MAX_MICROBATCHES):
        raise ScheduleError(
            f"microbatches must be between 1 and {MAX_MICROBATCHES}, got {microbatches}"
        )


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe: all forwards, then all backwards (in microbatch order, as torch's ScheduleGPipe)."""
    _check_sizes(stages, microbatches)
    return _built("gpipe", stages, stages, microbatches, gpipe_orders(stages, microbatches))


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush) as Megatron-LM and DeepSpeed run it."""
    _check_sizes(stages, microbatches)
    return _built("1f1b", stages, stages, microbatches, one_f_one_b_orders(stages, microbatches))


def interleaved_1f1b(stages: int, microbatches: int, virtual_stages: int) -> Schedule:
    """Megatron-LM's interleaved 1F1B: ``virtual_stages`` model chunks per rank.

    Rank ``s`` holds model stages ``v * stages + s``. Microbatches go through the chunks in
    groups of ``stages`` (Megatron's default ``microbatch_group_size_per_vp_stage``), so
    ``microbatches`` must be a multiple of ``stages``.
    """
    _check_sizes(stages, microbatches)
    if virtual_stages < 1:
        raise ScheduleError(f"virtual_stages must be >= 1, got {virtual_stages}")
    if virtual_stages > 1 and microbatches % stages:
        raise ScheduleError(
            f"interleaved 1F1B needs microbatches to be a multiple of stages ({microbatches} % {stages} != 0)"
        )
    orders = interleaved_1f1b_orders(stages, microbatches, virtual_stages)
    return _built("interleaved-1f1b", stages, stages * virtual_stages, microbatches, orders)


def _built(name: str, ranks: int, stages: int, microbatches: int, orders: Orders) -> Schedule:
    return Schedule(
        name, ranks, stages, microbatches, tuple(tuple(Op(*op) for op in o) for o in orders)
    )


#: The built-in schedules by name: ``builder(stages, microbatches, virtual_stages)``. The one
#: table of schedule names: the CLI's choices and the server's request and response models are
#: built from it (adding a schedule: its builder, its entry here, its tests).
BUILDERS: dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": lambda s, m, v: gpipe(s, m),
    "1f1b": lambda s, m, v: one_f_one_b(s, m),
    "interleaved-1f1b": interleaved_1f1b,
}
#: Names accepted by :func:`make_schedule` (besides the aliases of :data:`ALIASES`).
SCHEDULE_NAMES: tuple[str, ...] = tuple(BUILDERS)
#: Other spellings :func:`make_schedule` accepts (after lower-casing, ``_`` as ``-``).
ALIASES = {"interleaved1f1b": "interleaved-1f1b", "interleaved": "interleaved-1f1b"}


def make_schedule(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Schedule:
    """Build a named schedule; ``stages`` is the number of pipeline ranks.

    Args:
        name: one of :data:`SCHEDULE_NAMES` or :data:`ALIASES` (any case, ``_`` for ``-``).
        stages: pipeline ranks.
        microbatches: microbatches per iteration.
        virtual_stages: model chunks per rank (interleaved 1F1B only; the others ignore it).

    Raises:
        ScheduleError: an unknown name, or sizes the schedule cannot take.
    """
    key = name.lower().replace("_", "-")
    builder = BUILDERS.get(ALIASES.get(key, key))
    if builder is None:
        raise ScheduleError(
            f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULE_NAMES)}"
        )
    return builder(stages, microbatches, virtual_stages)
