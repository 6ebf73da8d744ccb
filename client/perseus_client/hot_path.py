"""The training thread's per-instruction path: a handful of operations per instruction edge.

:meth:`InstructionPath.begin` and :meth:`InstructionPath.end` are what
:meth:`PerseusClient.begin` / :meth:`PerseusClient.end` are (the same bound methods), and what
the integrations call around each forward / backward. Per instruction they do:

- ``begin``: one state check, one comparison of ``(kind, microbatch, stage)`` with the compiled
  plan's entry at the current position (:class:`~perseus_client.plan.CompiledPlan`: flat tuples,
  instruction -> clock), one clock call into the controller (a synchronous backend's lock applied
  in that call, :meth:`FrequencyController.apply_now`, a no-op when the clock does not change;
  on a real GPU the request queued for the controller thread, ordered after the previous
  instruction's CUDA end event), the backend's ``begin_instruction`` and one timestamp append;
- ``end``: the backend's ``end_instruction`` and one timestamp append.

At the iteration's end, :meth:`InstructionPath.finish` hands over the timestamps: the records are
built from them (:func:`build_records`) by whoever reads them first, the reporter thread when it
builds the report (or a reader of ``client.last_report``), not the training thread.

Nothing else runs per instruction: the executed instruction is the plan's entry (only an
instruction that is not, with no plan, after a mismatch or without a stage, takes the slow path,
which records it). What is measured only sometimes (energy while profiling, CUDA
events on GPUs) runs in the ``extras`` branch, one flag test when off.

The semantics are :class:`~perseus_client.plan.PlanCursor`'s: a mismatch raises
:class:`~perseus_client.errors.PlanMismatchError` in strict mode, else is reported once and the
rest of the iteration runs at the maximum clock.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import Any

from perseus_client.controller import FrequencyController
from perseus_client.errors import ClientError, ConfigError, PlanMismatchError
from perseus_client.gpu.base import GpuBackend
from perseus_client.measurements import InstructionMeasurement
from perseus_client.plan import CompiledPlan, PlanCursor, compile_plan
from perseus_common.kinds import INSTRUCTION_KINDS
from perseus_common.wire.values import PlanUpdate

__all__ = ["InstructionPath"]

_KINDS = frozenset(INSTRUCTION_KINDS)

IDLE, ITERATION, INSTRUCTION = 0, 1, 2
"""The path's phase: outside an iteration, inside one, inside one of its instructions."""


def build_records(
    p: CompiledPlan,
    stamps: list[float],
    off: dict[int, tuple[str, int, int, int] | None],
    energy: dict[int, float] | None,
) -> tuple[InstructionMeasurement, ...]:
    """One iteration's instruction records from its timestamps (two per instruction).

    Also from the compiled plan's entries and the slow path's records (``off``; ``None``:
    aborted).
    """
    count = len(stamps) // 2
    times = [b - a for a, b in zip(stamps[0::2], stamps[1::2], strict=False)]
    if not off and energy is None and count <= p.n:
        return tuple(
            map(
                InstructionMeasurement,
                p.kinds[:count],
                p.microbatches[:count],
                p.stages[:count],
                p.clocks[:count],
                times,
                repeat(0.0, count),
            )
        )
    out = []
    for i in range(count):
        if i in off:
            what = off[i]
            if what is None:  # aborted
                continue
            kind, mb, stage, mhz = what
        else:
            kind, mb, stage, mhz = p.kinds[i], p.microbatches[i], p.stages[i], p.clocks[i]
        e = energy.get(i, 0.0) if energy is not None else 0.0
        out.append(InstructionMeasurement(kind, mb, stage, mhz, times[i], e))
    return tuple(out)


class InstructionPath:
    """One rank's per-instruction path (training thread only; see the module docstring)."""

    def __init__(
        self,
        gpu: GpuBackend,
        controller: FrequencyController,
        max_clock: int,
        *,
        pipeline_rank: int,
        strict: bool,
        on_mismatch: Callable[[PlanMismatchError], None] | None,
        torch: Any = None,
    ) -> None:
        self.gpu = gpu
        self.controller = controller
        self.max_clock = max_clock
        self.pipeline_rank = pipeline_rank
        self.strict = strict
        self.on_mismatch = on_mismatch
        self._torch = torch  # CUDA events (None: none)
        self._sync = gpu.synchronous_clocks
        self._apply_now = controller.apply_now
        self._request = controller.request
        self._gpu_begin = gpu.begin_instruction
        self._gpu_end = gpu.end_instruction
        self._now = gpu.timestamp
        self._compiled = compile_plan(None, max_clock)
        self._p = self._compiled
        self.phase = IDLE
        self._pos = 0
        self._stamps: list[float] = []
        self._off: dict[int, tuple[str, int, int, int] | None] = {}  # slow-path records
        self._desynced = False
        self.measure_energy = False
        self.record = False
        self._extras = False
        self._energy: dict[int, float] = {}
        self._e0 = 0
        self._events: list[tuple[Any, Any]] = []
        self._start_ev: Any = None
        #: The CUDA event recorded at the end of the last instruction (clock changes wait on it).
        self.last_end_ev: Any = None

    # -- iteration boundaries -------------------------------------------------------------------

    def start(self, plan: PlanUpdate | None, *, measure_energy: bool, record: bool) -> None:
        """Begin an iteration of ``plan`` (compiled once per plan and maximum clock)."""
        compiled = self._compiled
        if compiled.plan is not plan or compiled.max_clock != self.max_clock:
            compiled = self._compiled = compile_plan(plan, self.max_clock)
        self._p = compiled
        self._pos = 0
        self._stamps = []
        self._off = {}
        self._desynced = False
        self.measure_energy = measure_energy
        self.record = record
        self._extras = measure_energy or (self._torch is not None)
        if measure_energy:
            self._energy = {}
        if self._torch is not None:
            self._events = []
        self.phase = ITERATION

    def check_complete(self) -> None:
        """After :meth:`finish`: a plan instruction not executed is a mismatch."""
        p = self._p
        if p.n and not self._desynced and self._pos < p.n:
            self._mismatch(None, self._pos)

    def finish(self) -> tuple[Callable[[], tuple[InstructionMeasurement, ...]] | None, list[Any]]:
        """End the iteration: what builds its instruction records, and their CUDA event pairs.

        The builder is ``None`` unless ``record``; it is called off the training thread,
        when the report is built or read. For the event pairs see :meth:`check_complete`.
        """
        self.phase = IDLE
        if not self.record:
            return None, []
        events = self._events if self._torch is not None and not self.measure_energy else []
        p, stamps, off = self._p, self._stamps, self._off
        energy = self._energy if self.measure_energy else None
        return lambda: build_records(p, stamps, off, energy), events

    # -- instructions: the hot path -------------------------------------------------------------

    def begin(self, kind: str, microbatch: int, stage: int | None = None) -> None:
        """An instruction starts: lock its clock, note the time (see the module docstring)."""
        if self.phase != ITERATION:
            self._refuse()
        pos = self._pos
        self._pos = pos + 1
        p = self._p
        key = (kind, microbatch, stage)
        if pos < p.n and p.keys[pos] == key:
            mhz = p.clocks[pos]
        else:
            mhz = self._slow_clock(kind, microbatch, stage, pos)
        self.phase = INSTRUCTION
        if self._sync:
            self._apply_now(mhz, self.last_end_ev)
        else:
            # The lock lands after the previous instruction's end event: it belongs to this
            # instruction, which the GPU may reach well after the CPU issued it (the sampler
            # attributes its samples to the tag, see perseus_client.gpu.applied).
            self._request(mhz, self.last_end_ev, key)
        if self._extras:
            self._begin_extras()
        self._gpu_begin(kind, microbatch, stage)
        self._stamps.append(self._now())

    def end(self) -> None:
        """The instruction's body returned."""
        self._gpu_end()
        self._stamps.append(self._now())
        self.phase = ITERATION
        if self._extras:
            self._end_extras()

    def abort(self) -> None:
        """The instruction's body raised: nothing is recorded for it."""
        if self.phase != INSTRUCTION:
            return
        self.gpu.abort_instruction()
        self._stamps.append(self._now())
        self._off[self._pos - 1] = None
        self.phase = ITERATION
        if self._start_ev is not None:
            self._start_ev = None

    # -- the rest, off the hot path -------------------------------------------------------------

    def _refuse(self) -> None:
        if self.phase == IDLE:
            raise ClientError("instruction() must be used inside a client.iteration() block")
        raise ClientError("instruction() blocks do not nest")

    def _slow_clock(self, kind: str, microbatch: int, stage: int | None, pos: int) -> int:
        """Whether the instruction is not the plan's next one as given.

        That is: no plan, a profiling task without steps, no stage given, after a mismatch,
        or a mismatch.
        """
        if kind not in _KINDS:
            raise ConfigError(
                "kind", f"unknown instruction kind {kind!r} (one of {', '.join(INSTRUCTION_KINDS)})"
            )
        p = self._p
        planned_stage: int | None = None
        if not p.n or self._desynced:
            mhz = p.fixed if p.fixed is not None else self.max_clock
        elif (
            pos < p.n
            and p.kinds[pos] == kind
            and p.microbatches[pos] == microbatch
            and (stage is None or stage == p.stages[pos])
        ):
            mhz = p.clocks[pos]
            planned_stage = p.stages[pos]
        else:
            self._mismatch((kind, microbatch, stage), pos)
            mhz = self.max_clock
        if planned_stage is None:
            planned_stage = stage if stage is not None else self.pipeline_rank
        self._off[pos] = (kind, microbatch, planned_stage, mhz)
        return mhz

    def _mismatch(self, executed: tuple[str, int, int | None] | None, pos: int) -> None:
        err = PlanCursor.mismatch_error(self._p.plan, pos, executed)
        if self.strict:
            if executed is not None:  # keep the timestamps in pairs: this one is not recorded
                self._off[pos] = None
                self._stamps.extend((0.0, 0.0))
            raise err
        self._desynced = True
        if self.on_mismatch is not None:
            self.on_mismatch(err)

    def _begin_extras(self) -> None:
        gpu = self.gpu
        if self.measure_energy:
            gpu.synchronize()
            self._e0 = gpu.energy_mj()
        elif self.record:  # CUDA events
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            self._start_ev = ev

    def _end_extras(self) -> None:
        gpu = self.gpu
        torch = self._torch
        if torch is not None:
            timed = self.record and not self.measure_energy
            end_ev = torch.cuda.Event(enable_timing=timed)
            end_ev.record()
            self.last_end_ev = end_ev
            if timed:
                self._events.append((self._start_ev, end_ev))
        if self.measure_energy:
            gpu.synchronize()
            self._stamps[-1] = gpu.timestamp()
            self._energy[self._pos - 1] = (gpu.energy_mj() - self._e0) / 1000.0
