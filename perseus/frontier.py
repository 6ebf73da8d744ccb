"""The time-energy frontier: the result of a solve, its queries and its JSON form."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.bound import RelaxedBound
from perseus.errors import InfeasibleError, OptionError
from perseus.schedules import Schedule
from perseus_common.wire.values import PlanStep

__all__ = ["Frontier", "FrontierPoint", "plan_json"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
PlanArray = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class FrontierPoint:
    """One plan on the frontier: its true iteration time (s) and energy (J), and a bound.

    The bound is the certified lower bound on the energy of any plan that finishes within
    ``time``.
    """

    time: float
    energy: float
    lower_bound: float

    @property
    def gap(self) -> float:
        """Relative optimality gap ``energy / lower_bound - 1``."""
        return self.energy / self.lower_bound - 1.0


@dataclass(frozen=True, eq=False)
class Frontier:
    """Pareto-optimal plans by increasing iteration time.

    A plan is kept unless another is at least as fast and uses no more energy at every deadline
    both meet, counting the blocking power a faster plan draws while it waits; that is, points
    have strictly decreasing ``energy - blocking_power * ranks * time``. Energy itself mostly
    falls up to the least-energy plan (:attr:`min_energy_index`) and rises after it, but not
    strictly: a slower point may use more energy on its own than a faster one, as long as it
    uses less than the faster one *plus waiting* until its time. Those slower points are what a
    pipeline that must wait (for a straggler, for a deadline) should run;
    ``index_for_deadline(T)`` still returns the least-energy plan within ``T``.

    Attributes:
        schedule: the pipeline schedule the plans are for.
        blocking_power: watts a waiting GPU draws.
        max_frequency_time / max_frequency_energy: (T0, E0) of running everything at the
            highest frequency.
        times, energies, lower_bounds: ``(k,)`` arrays, one entry per point.
        plans: ``(k, n)`` option indices (``uint8``) into ``node_freqs``.
        node_freqs: ``(n, K)`` frequencies (MHz) of each DAG node's options.
        bound_times / bound_energies / bound_slopes: the certified lower bound, by increasing
            time: every breakpoint (``bound_slopes`` empty), or tangent lines at some
            deadlines (their slopes in ``bound_slopes``); read it through
            :attr:`relaxed_bound` (:class:`~perseus.bound.RelaxedBound`), never by
            interpolating the arrays (that is valid for breakpoints only).
    """

    schedule: Schedule
    blocking_power: float
    max_frequency_time: float
    max_frequency_energy: float
    times: FloatArray
    energies: FloatArray
    lower_bounds: FloatArray
    plans: PlanArray
    node_freqs: IntArray
    bound_times: FloatArray = field(default_factory=lambda: np.empty(0))
    bound_energies: FloatArray = field(default_factory=lambda: np.empty(0))
    bound_slopes: FloatArray = field(default_factory=lambda: np.empty(0))

    def __len__(self) -> int:
        return len(self.times)

    @property
    def points(self) -> list[FrontierPoint]:
        """Every frontier point: time, energy and lower bound, by index."""
        return [
            FrontierPoint(float(t), float(e), float(lb))
            for t, e, lb in zip(self.times, self.energies, self.lower_bounds, strict=True)
        ]

    @property
    def min_energy_index(self) -> int:
        """Index of the plan with the least energy per iteration."""
        return int(np.argmin(self.energies))

    @cached_property
    def relaxed_bound(self) -> RelaxedBound:
        """The certified lower bound as a function of the iteration time.

        Breakpoints, or tangent lines when :attr:`bound_slopes` is set; past the last
        breakpoint everything waits at blocking power.
        """
        return RelaxedBound.from_arrays(
            self.bound_times,
            self.bound_energies,
            self.bound_slopes,
            self.blocking_power * self.schedule.ranks,
        )

    def lower_bound_at(self, deadline: float) -> float:
        """Certified lower bound on the energy of one iteration lasting ``deadline`` seconds.

        The bound holds for any plan, waiting included; ``inf`` below the fastest possible
        time. The relaxed sweep may end up to a relative 1e-9 past that time: a deadline
        within it reads as the fastest time itself (``lower_bound_at(T0)`` is finite). See
        :attr:`relaxed_bound`.
        """
        return float(self.relaxed_bound.bound(float(deadline)))

    def energy_at(self, deadline: float) -> float:
        """Least energy of an iteration lasting ``deadline`` seconds using a frontier plan.

        A plan that finishes early waits at blocking power.
        """
        i = self.index_for_deadline(deadline, wait=True)
        return float(
            self.energies[i]
            + self.blocking_power * self.schedule.ranks * (deadline - self.times[i])
        )

    def frequencies(self, i: int) -> IntArray:
        """Frequency (MHz) of every DAG node in plan ``i``."""
        return self.node_freqs[np.arange(self.node_freqs.shape[0]), self.plans[i].astype(np.int64)]

    def plan(self, i: int) -> tuple[tuple[PlanStep, ...], ...]:
        """Plan ``i`` as the ranks run it: per rank, its steps in execution order.

        The wire's :class:`~perseus_common.wire.values.PlanStep` values, which the server deploys
        as they are and the rank client compiles.
        """
        freqs = self.frequencies(i).tolist()
        out: list[tuple[PlanStep, ...]] = []
        k = 0
        for order in self.schedule.orders:
            n = len(order)
            out.append(
                tuple(
                    PlanStep(op.kind, op.microbatch, f, op.stage)
                    for op, f in zip(order, freqs[k : k + n], strict=True)
                )
            )
            k += n
        return tuple(out)

    def plan_steps(self, i: int) -> list[list[dict[str, Any]]]:
        """Plan ``i`` (:meth:`plan`) as JSON (:func:`plan_json`)."""
        return plan_json(self.plan(i))

    # --- queries -----------------------------------------------------------------------------

    def index_for_deadline(self, deadline: float, *, wait: bool = False) -> int:
        """The least-energy plan with ``time <= deadline``.

        With ``wait=True`` the iteration is taken to last ``deadline`` whatever the plan (e.g. the
        pipeline waits for a straggler at the gradient sync), so a faster plan also pays
        blocking power until the deadline; the plan minimising that total is returned.
        """
        if not np.isfinite(deadline):
            raise InfeasibleError(f"deadline must be a finite number of seconds, got {deadline!r}")
        ok = np.flatnonzero(self.times <= deadline * (1 + 1e-12))
        if ok.size == 0:
            raise InfeasibleError(
                f"no plan finishes within {deadline:.6g} s; the fastest plan takes {self.times[0]:.6g} s"
            )
        if not wait:
            return int(ok[np.argmin(self.energies[ok])])
        ranks = self.schedule.ranks
        total = self.energies[ok] + self.blocking_power * ranks * (deadline - self.times[ok])
        return int(ok[np.argmin(total)])

    def index_for_slowdown(self, slowdown: float) -> int:
        """The least-energy plan at most ``slowdown`` (e.g. 0.05 = 5 %) slower than T0."""
        if not (np.isfinite(slowdown) and slowdown >= 0):
            raise InfeasibleError(f"slowdown must be a number >= 0, got {slowdown!r}")
        return self.index_for_deadline(self.max_frequency_time * (1 + slowdown))

    def index_for_energy_budget(self, budget: float) -> int:
        """The fastest plan whose energy per iteration is at most ``budget`` joules."""
        ok = np.flatnonzero(self.energies <= budget)
        if not np.isfinite(budget) or ok.size == 0:
            raise InfeasibleError(
                f"no plan uses at most {budget:.6g} J per iteration; the least-energy plan uses {self.energies.min():.6g} J"
            )
        return int(ok[0])

    def index_for_cost(self, eta: float, max_power: float) -> int:
        """The plan minimising Zeus's cost ``eta * E + (1 - eta) * MAXPOWER * T``.

        ``eta`` in [0, 1] weighs energy against time: 0 selects the fastest plan, 1 the
        least-energy plan. ``max_power`` is one GPU's maximum power limit (W, NVML's
        ``nvmlDeviceGetPowerManagementLimitConstraints`` max); ``MAXPOWER = max_power * ranks``
        is that of the pipeline's GPUs, whose energy ``E`` is. (For the whole job both terms
        scale by its ``data_parallel * tensor_parallel`` copies, so the choice is the same.)
        Ties go to the faster plan. Raises :class:`OptionError` naming ``eta`` or ``max_power``.
        """
        if not (isinstance(eta, int | float) and 0.0 <= eta <= 1.0):
            raise OptionError(f"eta must be a number in [0, 1], got {eta!r}", field="eta")
        if not (isinstance(max_power, int | float) and np.isfinite(max_power) and max_power > 0):
            raise OptionError(
                f"max_power must be a finite number of watts > 0, got {max_power!r}",
                field="max_power",
            )
        watts = float(max_power) * self.schedule.ranks
        cost = eta * self.energies + (1.0 - eta) * watts * self.times
        return int(np.argmin(cost))

    def thinned(self, resolution: float) -> Frontier:
        """Keep points at least ``resolution`` seconds apart, always keeping the first and last."""
        if resolution <= 0 or len(self) <= 2:
            return self
        keep = [0]
        for i in range(1, len(self) - 1):
            if (
                self.times[i] - self.times[keep[-1]] >= resolution
                and self.times[-1] - self.times[i] >= resolution
            ):
                keep.append(i)
        keep.append(len(self) - 1)
        idx = np.asarray(keep)
        return replace(
            self,
            times=self.times[idx],
            energies=self.energies[idx],
            lower_bounds=self.lower_bounds[idx],
            plans=self.plans[idx],
        )

    # --- JSON --------------------------------------------------------------------------------

    def to_json(self, *, plans: bool = False, compact: bool = False) -> dict[str, Any]:
        """The CLI's JSON document.

        ``plans=True`` adds every point's ``plan`` in the per-rank clock form of
        :mod:`perseus.plan_codec` (``plan_encoding`` holds each rank's instructions and clock
        table once; :func:`perseus.plan_codec.decode_rank_plans` reads it, and the old form of
        one ``{instruction, microbatch, frequency}`` per instruction per point).
        ``compact=True`` adds what :meth:`from_json` needs to rebuild the frontier exactly
        (schedule and the plans as one compressed string, ``plans_z``).
        """
        from perseus import plan_codec

        sched = self.schedule
        doc: dict[str, Any] = {
            "schedule": sched.name,
            "stages": sched.ranks,
            "virtual_stages": sched.virtual_stages,
            "microbatches": sched.microbatches,
            "blocking_power": self.blocking_power,
            "max_frequency_time": self.max_frequency_time,
            "max_frequency_energy": self.max_frequency_energy,
            "points": [],
        }
        for i in range(len(self)):
            pt: dict[str, Any] = {
                "time": float(self.times[i]),
                "energy": float(self.energies[i]),
                "lower_bound": float(self.lower_bounds[i]),
            }
            doc["points"].append(pt)
        if plans:
            orders = [[(op.kind, op.microbatch, op.stage) for op in o] for o in sched.orders]
            n_ops = sum(len(o) for o in orders)
            doc["plan_encoding"], rows = plan_codec.encode_rank_plans(
                orders, self.node_freqs[:n_ops], self.plans
            )
            for pt, row in zip(doc["points"], rows, strict=True):
                pt["plan"] = row
        if compact:
            doc["encoded"] = {
                "schedule": sched.to_json(),
                "plans_z": plan_codec.encode_rows(self.plans),
                "plans_shape": list(self.plans.shape),
                "node_freqs": base64.b64encode(self.node_freqs.astype("<i4").tobytes()).decode(),
                "node_freqs_shape": list(self.node_freqs.shape),
                "bound_times": self.bound_times.tolist(),
                "bound_energies": self.bound_energies.tolist(),
            }
            if self.bound_slopes.size:
                doc["encoded"]["bound_slopes"] = self.bound_slopes.tolist()
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Frontier:
        """Rebuild a frontier written by ``to_json(compact=True)``."""
        from perseus import plan_codec

        enc = doc["encoded"]
        if "plans_z" in enc:
            plans = plan_codec.decode_rows(enc["plans_z"], enc["plans_shape"])
        else:  # written before plans were compressed
            plans = np.frombuffer(base64.b64decode(enc["plans"]), dtype=np.uint8).reshape(
                enc["plans_shape"]
            )
        node_freqs = (
            np.frombuffer(base64.b64decode(enc["node_freqs"]), dtype="<i4")
            .reshape(enc["node_freqs_shape"])
            .astype(np.int64)
        )
        pts = doc["points"]
        return cls(
            schedule=Schedule.from_json(enc["schedule"]),
            blocking_power=float(doc["blocking_power"]),
            max_frequency_time=float(doc["max_frequency_time"]),
            max_frequency_energy=float(doc["max_frequency_energy"]),
            times=np.array([p["time"] for p in pts], dtype=np.float64),
            energies=np.array([p["energy"] for p in pts], dtype=np.float64),
            lower_bounds=np.array([p["lower_bound"] for p in pts], dtype=np.float64),
            plans=np.array(plans, dtype=np.uint8),
            node_freqs=node_freqs,
            bound_times=np.asarray(enc.get("bound_times", []), dtype=np.float64),
            bound_energies=np.asarray(enc.get("bound_energies", []), dtype=np.float64),
            bound_slopes=np.asarray(enc.get("bound_slopes", []), dtype=np.float64),
        )


def plan_json(plan: Sequence[Sequence[PlanStep]]) -> list[list[dict[str, Any]]]:
    """A per-rank plan as JSON: per rank, ``{instruction, microbatch, stage, frequency}``.

    What ``GET /jobs/{id}/plan?steps=true`` answers (``frequency`` in MHz).
    """
    return [
        [
            {
                "instruction": s.instruction,
                "microbatch": s.microbatch,
                "stage": s.stage,
                "frequency": s.frequency_mhz,
            }
            for s in rank
        ]
        for rank in plan
    ]
