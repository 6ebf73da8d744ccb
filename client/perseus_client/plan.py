"""Compiling the wire's plans for the training thread, and the cursor that walks one iteration.

The client has no plan classes of its own: a plan is the wire's
:class:`~perseus_common.wire.values.PlanUpdate` (one rank's ordered
:class:`~perseus_common.wire.values.PlanStep` values with the SM clock of each), as the server
pushes it and as :func:`plan_from_steps` builds one offline. While a job is profiling the plan
carries a :class:`~perseus_common.wire.values.ProfilingTask`: every instruction runs at the
task's clock, whatever the steps say.

* :func:`received_plan` — what the client takes of a plan the server pushed (a profiling task
  at clock 0 is none; negative iteration counts count as 0);
* :func:`compile_plan` — one iteration of a plan as the flat tuples of a :class:`CompiledPlan`,
  which the training thread indexes by position;
* :class:`PlanCursor` checks that the training loop executes exactly the plan's instructions in
  order and yields the clock of each. In strict mode a mismatch raises
  :class:`~perseus_client.errors.PlanMismatchError` naming both the executed and the expected
  instruction; otherwise the cursor reports the mismatch once through a callback and runs the
  rest of the iteration at the maximum clock (the safe choice: never slower than planned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from perseus_client.errors import ConfigError, PlanMismatchError
from perseus_common.kinds import INSTRUCTION_KINDS
from perseus_common.wire.values import PlanStep, PlanUpdate, ProfilingTask

__all__ = ["CompiledPlan", "PlanCursor", "compile_plan", "plan_from_steps", "received_plan"]


def plan_from_steps(
    steps: Iterable[Mapping[str, Any] | PlanStep],
    *,
    version: int = 1,
    reason: str = "",
    expected_iteration_time: float = 0.0,
) -> PlanUpdate:
    """A plan built from :class:`PlanStep` values or ``Frontier.plan_steps`` dicts.

    The dicts are ``{"instruction", "microbatch", "stage", "frequency"}`` (``stage`` optional,
    0). Raises :class:`~perseus_client.errors.ConfigError` naming the step of a malformed one or
    of an unknown instruction.
    """
    out: list[PlanStep] = []
    for i, s in enumerate(steps):
        if isinstance(s, PlanStep):
            out.append(s)
            continue
        try:
            out.append(
                PlanStep(
                    str(s["instruction"]),
                    int(s["microbatch"]),
                    int(s["frequency"]),
                    int(s.get("stage", 0)),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"steps[{i}]", f"invalid plan step {s!r}: {exc}") from exc
    for i, st in enumerate(out):
        if st.instruction not in INSTRUCTION_KINDS:
            raise ConfigError(
                f"steps[{i}].instruction", f"unknown instruction kind {st.instruction!r}"
            )
    return PlanUpdate(version, tuple(out), reason, expected_iteration_time)


def received_plan(update: PlanUpdate) -> PlanUpdate:
    """What the client takes of a plan the server pushed.

    A profiling task at clock 0 is none; negative iteration counts count as 0. ``update``
    itself when it needs no change.
    """
    p = update.profiling
    if p is None:
        return update
    if p.frequency_mhz <= 0:
        return replace(update, profiling=None)
    if p.warmup_iterations < 0 or p.iterations < 0:
        task = ProfilingTask(p.frequency_mhz, max(0, p.warmup_iterations), max(0, p.iterations))
        return replace(update, profiling=task)
    return update


def _describe(kind: str, microbatch: int, stage: int | None) -> str:
    where = "" if stage is None else f", stage {stage}"
    return f"{kind}(microbatch {microbatch}{where})"


class PlanCursor:
    """Walks one iteration of a plan; reusable across iterations via :meth:`start`.

    Args:
        max_clock: the clock used when there is no plan, or after a mismatch (non-strict).
        strict: raise on a mismatch instead of falling back to ``max_clock``.
        on_mismatch: called with the error in non-strict mode (the client logs it once).
    """

    __slots__ = (
        "max_clock",
        "strict",
        "on_mismatch",
        "_steps",
        "_pos",
        "_plan",
        "_fixed",
        "_desynced",
        "_last_stage",
    )

    def __init__(
        self,
        max_clock: int,
        *,
        strict: bool = True,
        on_mismatch: Callable[[PlanMismatchError], None] | None = None,
    ) -> None:
        self.max_clock = max_clock
        self.strict = strict
        self.on_mismatch = on_mismatch
        self._steps: Sequence[tuple[str, int, int, int]] = ()
        self._plan: PlanUpdate | None = None
        self._pos = 0
        self._fixed: int | None = max_clock
        self._desynced = False
        self._last_stage: int | None = None

    def start(self, plan: PlanUpdate | None) -> None:
        """Begin an iteration of ``plan`` (``None`` or version 0: everything at max clock)."""
        self._plan = plan
        self._pos = 0
        self._desynced = False
        if plan is None or (not plan.steps and plan.profiling is None):
            self._steps = ()
            self._fixed = self.max_clock
        else:
            self._steps = [
                (s.instruction, s.microbatch, s.stage, s.frequency_mhz) for s in plan.steps
            ]
            self._fixed = plan.profiling.frequency_mhz if plan.profiling is not None else None

    @property
    def position(self) -> int:
        """How many instructions of this iteration have been executed."""
        return self._pos

    def next_clock(self, kind: str, microbatch: int, stage: int | None) -> int:
        """Check the executed instruction against the plan and return its clock."""
        pos = self._pos
        self._pos = pos + 1
        self._last_stage = None
        steps = self._steps
        if not steps or self._desynced:
            return self._fixed if self._fixed is not None else self.max_clock
        if pos < len(steps):
            k, m, s, f = steps[pos]
            if k == kind and m == microbatch and (stage is None or stage == s):
                self._last_stage = s
                return self._fixed if self._fixed is not None else f
        self._raise_or_desync(PlanCursor.mismatch_error(self._plan, pos, (kind, microbatch, stage)))
        return self.max_clock

    def last_stage(self, default: int) -> int:
        """The plan's stage of the instruction just matched (``default`` when none matched)."""
        s = self._last_stage
        return default if s is None else s

    def finish(self) -> None:
        """End the iteration: every planned instruction must have been executed."""
        if self._steps and not self._desynced and self._pos < len(self._steps):
            self._raise_or_desync(PlanCursor.mismatch_error(self._plan, self._pos, None))

    def _raise_or_desync(self, err: PlanMismatchError) -> None:
        if self.strict:
            raise err
        self._desynced = True
        if self.on_mismatch is not None:
            self.on_mismatch(err)

    @staticmethod
    def mismatch_error(
        plan: PlanUpdate | None, pos: int, executed: tuple[str, int, int | None] | None
    ) -> PlanMismatchError:
        """The error for ``executed`` at position ``pos`` of an iteration of ``plan``.

        ``executed`` is ``None`` when the iteration ended at ``pos``; the error names both
        the executed and the expected instruction.
        """
        steps = plan.steps if plan is not None else ()
        version = plan.version if plan is not None else 0
        expected: tuple[str, int, int] | None = None
        if pos < len(steps):
            st = steps[pos]
            expected = (st.instruction, st.microbatch, st.stage)
        if executed is None:
            assert expected is not None
            msg = (
                f"iteration ended after {pos} instructions but plan version {version} expects "
                f"{_describe(*expected)} next ({len(steps)} per iteration)"
            )
        elif expected is not None:
            msg = (
                f"executed {_describe(*executed)} but plan version {version} expects "
                f"{_describe(*expected)} as instruction #{pos} of this iteration"
            )
        else:
            msg = (
                f"executed {_describe(*executed)} but plan version {version} has only "
                f"{len(steps)} instructions per iteration"
            )
        return PlanMismatchError(
            msg, executed=executed, expected=expected, position=pos, plan_version=version
        )


class CompiledPlan:
    """One iteration of a plan as flat tuples the training thread indexes by position.

    ``keys[i] == (instruction, microbatch, stage)`` and ``clocks[i]`` of instruction ``i`` (the
    profiling task's clock for every instruction while profiling), ``n`` instructions.

    ``n == 0``: no steps to follow (no plan, version 0, or a profiling task without steps):
    every instruction runs at ``fixed`` (the maximum clock or the task's clock). Built by
    :func:`compile_plan`.
    """

    __slots__ = (
        "plan",
        "max_clock",
        "n",
        "keys",
        "kinds",
        "microbatches",
        "stages",
        "clocks",
        "fixed",
    )

    def __init__(self, plan: PlanUpdate | None, max_clock: int) -> None:
        self.plan = plan
        self.max_clock = max_clock
        steps: tuple[PlanStep, ...] = ()
        fixed: int | None = max_clock
        if plan is not None and (plan.steps or plan.profiling is not None):
            steps = plan.steps
            fixed = plan.profiling.frequency_mhz if plan.profiling is not None else None
        self.fixed = fixed
        self.n = len(steps)
        self.keys = tuple((s.instruction, s.microbatch, s.stage) for s in steps)
        self.kinds = tuple(s.instruction for s in steps)
        self.microbatches = tuple(s.microbatch for s in steps)
        self.stages = tuple(s.stage for s in steps)
        self.clocks = tuple(s.frequency_mhz if fixed is None else fixed for s in steps)


def compile_plan(plan: PlanUpdate | None, max_clock: int) -> CompiledPlan:
    """One iteration of ``plan`` for the training thread (``None``: everything at ``max_clock``)."""
    return CompiledPlan(plan, max_clock)
