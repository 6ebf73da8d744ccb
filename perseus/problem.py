"""An energy-scheduling problem, and the true evaluation of plans.

A pipeline DAG whose nodes have measured (frequency, time, energy) options.

A *plan* is an array of option indices, one per DAG node (``uint8``; index 0 is the node's
highest frequency), so storing many plans costs one byte per instruction each.

The energy of a plan over one iteration of length ``T`` on ``R`` GPUs is::

    E = sum(node energy) + P_block * (R * T - sum(node time))

because a GPU that is not computing waits on a pipeline neighbour and draws the blocking power.

With communication (the profile's :class:`~perseus_common.communication.Communication`), the DAG
also has transfer and phase nodes (:mod:`perseus.dag`), each with a single option (frequency 0:
a plan never gives them a clock, and the plan's per-rank steps are those of the ops). A transfer
node lasts the transfer's time and its energy is ``power * time`` (``power`` defaults to the
blocking power), so in the sum above it adds ``(power - P_block) * time``: nothing when the GPU
draws the blocking power while it waits for the data, the difference when it draws more; its
time counts once, for the receiving rank. A phase node lasts the rank's phases' time and holds
their energy (the blocking power for the time when a phase gives none).

Per-clock transfer times: the transfer node has the time at the highest clock (the shortest;
the least of the per-clock times if they are not monotone), while the *true* evaluation
(:meth:`EnergyProblem.evaluate_many`) takes each transfer's time at the clock the plan gives the
op that produced the data. The solver bounds on :meth:`EnergyProblem.cost_charged` (the
shortest transfers, each transfer's cost at its producer's clock charged to the producer: the
same effective costs as the truth, no longer durations) and plans on its
:meth:`EnergyProblem.producer_charged` (never faster than the truth). A phase given per clock
has a single option, its highest clock's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from perseus.dag import PipelineDAG
from perseus.errors import ProfileError
from perseus.profiles import Profile
from perseus.schedules import Schedule
from perseus_common.communication import Communication, Transfer

__all__ = ["EnergyProblem", "PlanEvaluation", "ZERO_BUBBLE_SPLIT"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
PlanArray = npt.NDArray[np.uint8]

#: When a profile has only ``backward`` but the schedule splits it (zero-bubble schedules),
#: ``backward_input`` and ``backward_weight`` are each taken as this fraction of ``backward``.
ZERO_BUBBLE_SPLIT = {"backward_input": 0.5, "backward_weight": 0.5}


@dataclass(frozen=True)
class PlanEvaluation:
    """The true iteration time (s) and energy (J) of one plan."""

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
        clocked_transfers: transfer nodes whose time depends on the producer's clock;
            ``clocked_times[j, k]`` is node ``clocked_transfers[j]``'s time when its producer
            runs its option ``k`` (the producer is node ``clocked_producers[j]``),
            ``clocked_power[j]`` its power (what the true evaluation uses).
        true_times, true_energies: what the true evaluation takes for the nodes when they
            differ from ``times`` / ``energies`` (:meth:`producer_charged`); None: the same.
    """

    dag: PipelineDAG
    profile: Profile
    blocking_power: float
    freqs: IntArray
    times: FloatArray
    energies: FloatArray
    num_options: IntArray
    clocked_transfers: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    clocked_producers: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    clocked_times: FloatArray = field(default_factory=lambda: np.empty((0, 1)))
    clocked_power: FloatArray = field(default_factory=lambda: np.empty(0))
    true_times: FloatArray | None = None
    true_energies: FloatArray | None = None

    @classmethod
    def build(cls, profile: Profile, schedule: Schedule, blocking_power: float) -> EnergyProblem:
        """Map every op of ``schedule`` to its profile entry.

        The profile may describe every model stage (``profile.stages == schedule.stages``) or
        every rank (``profile.stages == schedule.ranks``); in the latter case, with ``V`` virtual
        stages per rank, each model chunk takes ``1/V`` of its rank's time and energy.

        Communication: a model boundary's transfer is the profile's boundary of the same number
        (per-rank profile: the boundary between the two ranks; the edge from the last rank back
        to the first, which such a profile cannot name, takes the direction's slowest
        transfer); a rank runs the phases of every profile stage it holds.
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
        comm = profile.communication
        transfer_of = _model_transfers(comm, schedule, per_model=profile.stages == schedule.stages)
        phases_of = {
            r: [
                p
                for st in sorted({entry_stage[s] for s in _stages_of(schedule, r)})
                for p in comm.phases.get(st, ())
            ]
            for r in range(schedule.ranks)
        }
        phases_of = {r: ps for r, ps in phases_of.items() if ps}
        dag = PipelineDAG.from_schedule(
            schedule, transfers=set(transfer_of), phase_ranks=set(phases_of)
        )
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
        clocked: list[tuple[int, Transfer, int]] = []
        pb = float(blocking_power)
        for j, node in enumerate(dag.comm):
            if node.kind == "phase":
                phases = phases_of[node.rank]
                dt = sum(ph.time for ph in phases)
                de = sum(pb * ph.time if ph.energy is None else ph.energy for ph in phases)
            else:
                tr = transfer_of[(node.boundary, node.kind.removeprefix("transfer_"))]
                dt = tr.time if tr.times_by_clock is None else min(tr.times_by_clock.values())
                de = (pb if tr.power is None else tr.power) * dt
                if tr.times_by_clock is not None:
                    clocked.append((dag.num_ops + j, tr, node.producer))
            rows.append((np.zeros(1, np.int64), np.array([float(dt)]), np.array([float(de)])))
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
        ct = np.empty((len(clocked), k))
        for j, (_, tr, producer) in enumerate(clocked):
            ct[j] = [tr.time_at(int(f)) for f in freqs[producer]]
        return cls(
            dag,
            profile,
            pb,
            freqs,
            times,
            energies,
            num,
            np.array([v for v, _, _ in clocked], dtype=np.int64),
            np.array([p for _, _, p in clocked], dtype=np.int64),
            ct,
            np.array([pb if tr.power is None else tr.power for _, tr, _ in clocked]),
        )

    @property
    def num_nodes(self) -> int:
        """The number of DAG nodes: ops, transfers and phases."""
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
        d = (self.times if self.true_times is None else self.true_times)[rows, idx]
        e = (self.energies if self.true_energies is None else self.true_energies)[rows, idx]
        if self.clocked_transfers.size:
            # The true time of a per-clock transfer: at the clock its producer runs.
            v = self.clocked_transfers
            tt = self.clocked_times[np.arange(len(v))[None, :], idx[:, self.clocked_producers]]
            d[:, v] = tt
            e[:, v] = self.clocked_power[None, :] * tt
        # Imported here: loading the kernels loads numba (~0.3 s of a process's start), which a
        # server needs only once it evaluates a plan (its solves run in worker processes).
        from perseus.kernels.longest_paths import iteration_times

        dag = self.dag
        t = iteration_times(dag.topo, dag.pred_ptr, dag.pred_idx, np.ascontiguousarray(d))
        energy = e.sum(axis=1) + self.blocking_power * (self.dag.num_ranks * t - d.sum(axis=1))
        return t, energy

    def max_frequency_plan(self) -> PlanArray:
        """The plan that runs every node at its first option, the highest clock."""
        return np.zeros(self.num_nodes, dtype=np.uint8)

    def frequencies_of(self, plan: PlanArray) -> IntArray:
        """The clock (MHz) of every node under ``plan``."""
        return self.freqs[np.arange(self.num_nodes), np.asarray(plan, dtype=np.int64)]

    def cost_charged(self) -> EnergyProblem:
        """The problem the solver bounds on when transfers have per-clock times.

        Each producer's option ``k`` also carries the effective cost its transfer has at
        that clock beyond the transfer node's, ``(power - P) * (t_k - t_min)`` in its energy
        (its time unchanged; the transfer node keeps the shortest time ``t_min``). For every
        plan the sum of effective costs then equals the truth's exactly and every duration
        is at most the true one, so the relaxation of this model is below the truth whatever
        the transfer's power: below the blocking power (the excess negative, a longer
        transfer *cheaper*) as much as above it. :meth:`evaluate_many` still gives the
        truth. ``self`` when no per-clock transfer draws other than the blocking power.
        """
        if not self.clocked_transfers.size:
            return self
        excess = self.clocked_power - self.blocking_power
        if not np.any(excess != 0.0):
            return self
        shift = np.zeros_like(self.energies)
        base = self.times[self.clocked_transfers, 0]
        for j, p in enumerate(self.clocked_producers.tolist()):
            shift[p] += excess[j] * (self.clocked_times[j] - base[j])
        return replace(
            self,
            energies=self.energies + shift,
            true_times=self.times if self.true_times is None else self.true_times,
            true_energies=self.energies if self.true_energies is None else self.true_energies,
        )

    def producer_charged(self) -> EnergyProblem:
        """The problem the solver plans on when transfers have per-clock times.

        Each producer's option ``k`` also takes the extra time its transfer needs at that
        clock (over the transfer node's, the highest clock's), at the blocking power (its
        effective cost is unchanged). For every plan this model's iteration time is at least
        the true one (the data leaves no earlier; only the producer's own rank waits longer
        than it truly does), and they agree at the highest clocks, so a plan on time here is
        on time on the truth. :meth:`evaluate_many` still gives the truth. ``self`` when
        nothing is clocked.
        """
        if not self.clocked_transfers.size:
            return self
        extra = np.zeros_like(self.times)
        base = self.times[self.clocked_transfers, 0]
        for j, p in enumerate(self.clocked_producers.tolist()):
            np.maximum(extra[p], self.clocked_times[j] - base[j], out=extra[p])
        return replace(
            self,
            times=self.times + extra,
            energies=self.energies + self.blocking_power * extra,
            true_times=self.times if self.true_times is None else self.true_times,
            true_energies=self.energies if self.true_energies is None else self.true_energies,
        )

    @property
    def num_ops(self) -> int:
        """Nodes ``0..num_ops-1`` are ops (the rest: transfers and phases, one option each)."""
        return self.dag.num_ops


def _stages_of(schedule: Schedule, rank: int) -> list[int]:
    return sorted({op.stage for op in schedule.orders[rank]})


def _model_transfers(
    comm: Communication, schedule: Schedule, *, per_model: bool
) -> dict[tuple[int, str], Transfer]:
    """``{(model boundary, direction): transfer}`` of every cross-rank boundary measured."""
    if comm.is_none or not comm.transfers:
        return {}
    rank_of = schedule.stage_rank()
    out: dict[tuple[int, str], Transfer] = {}
    for c in range(schedule.stages - 1):
        a, b = rank_of[c], rank_of[c + 1]
        if a == b:
            continue
        for d in ("forward", "backward"):
            if per_model:
                tr = comm.transfer(c, d)
            elif abs(a - b) == 1:
                tr = comm.transfer(min(a, b), d)
            else:
                same = [t for (_, dd), t in comm.transfers.items() if dd == d]
                tr = max(same, key=lambda t: t.time) if same else None
            if tr is not None and (tr.time > 0 or tr.times_by_clock is not None):
                out[(c, d)] = tr

    return out
