"""An energy-scheduling problem: a pipeline DAG whose nodes have measured (frequency, time,
energy) options, and the true evaluation of plans.

A *plan* is an array of option indices, one per DAG node (``uint8``; index 0 is the node's
highest frequency), so storing many plans costs one byte per instruction each.

The energy of a plan over one iteration of length ``T`` on ``R`` GPUs is::

    E = sum(measured compute energy) + P_block * (R * T - sum(busy time))

because a GPU that is not computing waits on a pipeline neighbour and draws the blocking power.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.dag import PipelineDAG
from perseus.errors import ProfileError
from perseus.kernels.longest_paths import iteration_times
from perseus.profiles import Profile
from perseus.schedules import Schedule

__all__ = ["EnergyProblem", "PlanEvaluation", "ZERO_BUBBLE_SPLIT"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
PlanArray = npt.NDArray[np.uint8]

#: When a profile has only ``backward`` but the schedule splits it (zero-bubble schedules),
#: ``backward_input`` and ``backward_weight`` are each taken as this fraction of ``backward``.
ZERO_BUBBLE_SPLIT = {"backward_input": 0.5, "backward_weight": 0.5}


@dataclass(frozen=True)
class PlanEvaluation:
    time: float
    energy: float


@dataclass(frozen=True, eq=False)
class EnergyProblem:
    """The DAG plus, per node, its options padded into ``(n, K)`` arrays.

    Attributes:
        freqs, times, energies: ``(n, K)``; row ``i`` holds node ``i``'s options by decreasing
            frequency; padding (``num_options[i] <= k``) repeats the last option.
        num_options: valid options per node.
        blocking_power: watts drawn by a GPU waiting on the pipeline.
    """

    dag: PipelineDAG
    profile: Profile
    blocking_power: float
    freqs: IntArray
    times: FloatArray
    energies: FloatArray
    num_options: IntArray

    @classmethod
    def build(cls, profile: Profile, schedule: Schedule, blocking_power: float) -> EnergyProblem:
        """Map every op of ``schedule`` to its profile entry.

        The profile may describe every model stage (``profile.stages == schedule.stages``) or
        every rank (``profile.stages == schedule.ranks``); in the latter case, with ``V`` virtual
        stages per rank, each model chunk takes ``1/V`` of its rank's time and energy.
        """
        if not (blocking_power >= 0 and np.isfinite(blocking_power)):
            raise ProfileError(
                f"must be a finite number >= 0, got {blocking_power!r}", field="blocking_power"
            )
        if profile.stages == schedule.stages:
            scale = 1.0
            entry_stage = {s: s for s in range(schedule.stages)}
        elif profile.stages == schedule.ranks:
            scale = 1.0 / schedule.virtual_stages
            entry_stage = schedule.stage_rank()
        else:
            raise ProfileError(
                f"the profile has {profile.stages} stages but the job has {schedule.ranks} pipeline ranks"
                + (
                    f" ({schedule.stages} model stages)"
                    if schedule.stages != schedule.ranks
                    else ""
                ),
                field="stages",
            )
        dag = PipelineDAG.from_schedule(schedule)
        cache: dict[tuple[int, str], tuple[IntArray, FloatArray, FloatArray]] = {}

        def options(stage: int, kind: str) -> tuple[IntArray, FloatArray, FloatArray]:
            key = (stage, kind)
            if key not in cache:
                if profile.has(stage, kind):
                    p = profile[(stage, kind)]
                    cache[key] = (p.frequencies, p.times * scale, p.energies * scale)
                elif kind in ZERO_BUBBLE_SPLIT and profile.has(stage, "backward"):
                    p = profile[(stage, "backward")]
                    f = ZERO_BUBBLE_SPLIT[kind] * scale
                    cache[key] = (p.frequencies, p.times * f, p.energies * f)
                else:
                    raise ProfileError(
                        f"the schedule runs {kind} on stage {stage} but the profile has no such measurements",
                        field="instruction",
                    )
            return cache[key]

        rows = [options(entry_stage[op.stage], op.kind) for op in dag.ops]
        k = max(len(r[0]) for r in rows)
        if k > 255:
            raise ProfileError(
                f"at most 255 frequencies per instruction, got {k}", field="frequency"
            )
        n = len(rows)
        freqs = np.empty((n, k), dtype=np.int64)
        times = np.empty((n, k))
        energies = np.empty((n, k))
        num = np.empty(n, dtype=np.int64)
        for i, (f, t, e) in enumerate(rows):
            c = len(f)
            num[i] = c
            freqs[i, :c], times[i, :c], energies[i, :c] = f, t, e
            freqs[i, c:], times[i, c:], energies[i, c:] = f[-1], t[-1], e[-1]
        return cls(dag, profile, float(blocking_power), freqs, times, energies, num)

    @property
    def num_nodes(self) -> int:
        return self.dag.num_nodes

    def durations(self, plan: PlanArray) -> FloatArray:
        """Measured duration of every node under ``plan``."""
        return self.times[np.arange(self.num_nodes), np.asarray(plan, dtype=np.int64)]

    def evaluate(self, plan: PlanArray) -> PlanEvaluation:
        """True iteration time and energy of one plan, from the measurements."""
        t, e = self.evaluate_many(np.asarray(plan)[None, :])
        return PlanEvaluation(float(t[0]), float(e[0]))

    def evaluate_many(self, plans: PlanArray) -> tuple[FloatArray, FloatArray]:
        """True (iteration time, energy) of each row of ``plans`` (shape ``(k, n)``)."""
        idx = np.asarray(plans, dtype=np.int64)
        if idx.ndim != 2 or idx.shape[1] != self.num_nodes:
            raise ValueError(f"plans must have shape (k, {self.num_nodes}), got {idx.shape}")
        if (idx < 0).any() or (idx >= self.num_options[None, :]).any():
            raise ValueError("plan holds an option index the node does not have")
        rows = np.arange(self.num_nodes)[None, :]
        d = self.times[rows, idx]
        e = self.energies[rows, idx]
        dag = self.dag
        t = iteration_times(dag.topo, dag.pred_ptr, dag.pred_idx, np.ascontiguousarray(d))
        energy = e.sum(axis=1) + self.blocking_power * (self.dag.num_ranks * t - d.sum(axis=1))
        return t, energy

    def max_frequency_plan(self) -> PlanArray:
        return np.zeros(self.num_nodes, dtype=np.uint8)

    def frequencies_of(self, plan: PlanArray) -> IntArray:
        return self.freqs[np.arange(self.num_nodes), np.asarray(plan, dtype=np.int64)]
