"""The convex relaxation: per-node lower hulls, and the exact relaxed frontier they give.

Each node's Pareto-optimal options in (time, effective cost ``e - P t``) are replaced by the
lower convex hull of those points, a convex, decreasing, piecewise-linear cost of a continuous
duration. Minimising the sum of those costs subject to the longest path being at most ``T`` is a
linear program (the project time-cost trade-off problem) whose optimum ``G(T)`` is convex and
piecewise linear in ``T``; ``G(T) + P R T`` (``R`` ranks) is a certified lower bound on the
energy of any discrete plan within ``T``. :func:`relaxed_frontier` yields its breakpoints
(:mod:`perseus.kernels.relaxed` computes them); :class:`RelaxedFrontier` holds them all and
interpolates between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.errors import SolverCancelled
from perseus.kernels.relaxed import relaxed_chunk
from perseus.problem import EnergyProblem
from perseus.profiles import lower_hull_indices, pareto_indices

__all__ = ["Relaxation", "RelaxedStep", "RelaxedFrontier", "relaxed_frontier"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_INT_INF = 1 << 60  # "infinite" capacity; all finite capacities together stay below 2**52
_STEPS_PER_CHUNK = 64  # relaxed steps per compiled call (cancelling is heard between calls)


@dataclass(frozen=True, eq=False)
class Relaxation:
    """Per-node convex hulls (padded to ``(n, H)``) of the Pareto-optimal options.

    ``tau[i, :nv[i]]`` are hull vertex durations (increasing), ``cost`` their effective costs,
    ``slope[i, k]`` the slope of segment ``k`` (negative, increasing in ``k``).
    ``pareto`` is a boolean ``(n, K)`` mask of options not dominated in (time, effective cost),
    ``hull_mask`` of the options that are hull vertices.
    """

    tau: FloatArray
    cost: FloatArray
    slope: FloatArray
    nv: IntArray
    pareto: BoolArray
    hull_mask: BoolArray

    @classmethod
    def build(cls, problem: EnergyProblem) -> Relaxation:
        """The hulls of ``problem``'s nodes (nodes with the same options share the work)."""
        n, k = problem.times.shape
        eff = problem.energies - problem.blocking_power * problem.times
        # Nodes of the same (stage, kind) share rows: compute each distinct row once.
        _, first, inverse = np.unique(
            np.concatenate([problem.times, eff], axis=1),
            axis=0,
            return_index=True,
            return_inverse=True,
        )
        inverse = inverse.reshape(-1)
        hulls = []
        masks = []
        hmasks = []
        for i in first:
            m = int(problem.num_options[i])
            par = pareto_indices(problem.times[i, :m], eff[i, :m])
            h = par[lower_hull_indices(problem.times[i, par], eff[i, par])]
            hulls.append((problem.times[i, h], eff[i, h]))
            mask = np.zeros(k, dtype=bool)
            mask[par] = True
            masks.append(mask)
            hm = np.zeros(k, dtype=bool)
            hm[h] = True
            hmasks.append(hm)
        width = max(len(t) for t, _ in hulls)
        tau_u = np.full((len(hulls), width), np.inf)
        cost_u = np.zeros((len(hulls), width))
        slope_u = np.zeros((len(hulls), max(width - 1, 1)))
        nv_u = np.empty(len(hulls), dtype=np.int64)
        for r, (t, c) in enumerate(hulls):
            tau_u[r, : len(t)] = t
            cost_u[r, : len(t)] = c
            cost_u[r, len(t) :] = c[-1]
            if len(t) > 1:
                slope_u[r, : len(t) - 1] = np.diff(c) / np.diff(t)
            nv_u[r] = len(t)
        return cls(
            tau_u[inverse],
            cost_u[inverse],
            slope_u[inverse],
            nv_u[inverse],
            np.array(masks)[inverse],
            np.array(hmasks)[inverse],
        )

    @property
    def shortest(self) -> FloatArray:
        """Each node's shortest duration (its first hull vertex)."""
        return self.tau[:, 0]

    @property
    def longest(self) -> FloatArray:
        """Each node's longest duration (its last hull vertex)."""
        return self.tau[np.arange(len(self.nv)), self.nv - 1]


@dataclass(frozen=True)
class RelaxedStep:
    """One breakpoint of the relaxed frontier: iteration time, ``G(T)`` (sum of relaxed
    effective costs), the cut value (``-dG/dT`` just below ``T``) and the durations."""

    time: float
    cost: float
    slope: float
    durations: FloatArray


def relaxed_frontier(
    problem: EnergyProblem,
    relaxation: Relaxation | None = None,
    *,
    cancel: Callable[[], bool] | None = None,
) -> Iterator[RelaxedStep]:
    """Yield the breakpoints of the relaxed frontier from the slowest to the fastest ``T``.

    Each step's ``slope`` is the marginal energy cost of shortening the iteration further
    (``inf`` at the fastest point). ``cancel`` is polled between chunks of steps; returning
    ``True`` raises :class:`~perseus.errors.SolverCancelled`.
    """
    rel = relaxation or Relaxation.build(problem)
    dag = problem.dag
    d = rel.longest.copy()
    t_min = float(dag.iteration_time(rel.shortest))
    scale = min(1e6, 2.0**52 / (np.abs(rel.slope).max(axis=1).sum() + 1.0))
    n = problem.num_nodes
    flows = (
        np.zeros(n, np.int64),
        np.zeros(len(dag.src), np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
    )
    while True:
        if cancel is not None and cancel():
            raise SolverCancelled("frontier computation cancelled")
        times, costs, slopes, durations, d, done = relaxed_chunk(
            dag.topo, dag.pred_ptr, dag.pred_idx, dag.succ_ptr, dag.succ_idx, dag.src, dag.dst,
            rel.tau, rel.cost, rel.slope, rel.nv, rel.shortest, rel.longest,
            d, t_min, scale, _INT_INF, _STEPS_PER_CHUNK, *flows,
        )  # fmt: skip
        for i in range(len(times)):
            yield RelaxedStep(float(times[i]), float(costs[i]), float(slopes[i]), durations[i])
        if done:
            return


@dataclass(frozen=True, eq=False)
class RelaxedFrontier:
    """Every breakpoint of the relaxed frontier, by increasing time, and the bound they give.

    Attributes:
        relaxation: the hulls the breakpoints come from.
        times, costs: ``(b,)`` iteration times and ``G(T)`` at the breakpoints.
        durations: ``(b, n)`` the relaxed optimum's durations at each breakpoint.
        t_min, t_max: the fastest iteration time, and that of the longest durations.
        ranks_power: blocking power times ranks (``P R``), what an idle second of the whole
            pipeline costs.
    """

    relaxation: Relaxation
    times: FloatArray
    costs: FloatArray
    durations: FloatArray
    t_min: float
    t_max: float
    ranks_power: float

    @classmethod
    def from_steps(
        cls, problem: EnergyProblem, relaxation: Relaxation, steps: list[RelaxedStep]
    ) -> RelaxedFrontier:
        """The frontier of ``steps`` as :func:`relaxed_frontier` yields them (slowest first)."""
        dag = problem.dag
        ordered = steps[::-1]  # by increasing time
        return cls(
            relaxation=relaxation,
            times=np.array([s.time for s in ordered]),
            costs=np.array([s.cost for s in ordered]),
            durations=np.stack([s.durations for s in ordered]),
            t_min=float(dag.iteration_time(relaxation.shortest)),
            t_max=float(dag.iteration_time(relaxation.longest)),
            ranks_power=problem.blocking_power * dag.num_ranks,
        )

    def durations_at(self, deadlines: FloatArray) -> FloatArray:
        """The relaxed optimum's durations at each of ``deadlines`` (``(k, n)``): between
        breakpoints it moves linearly."""
        bp_t, bp_d = self.times, self.durations
        j = np.clip(np.searchsorted(bp_t, deadlines, side="right") - 1, 0, len(bp_t) - 1)
        k = np.minimum(j + 1, len(bp_t) - 1)
        span = bp_t[k] - bp_t[j]
        w = np.where(span > 0, (deadlines - bp_t[j]) / np.where(span > 0, span, 1.0), 0.0)
        w = np.clip(w, 0.0, 1.0)[:, None]
        out: FloatArray = (1 - w) * bp_d[j] + w * bp_d[k]
        return out

    def bound(self, times: FloatArray) -> FloatArray:
        """The certified lower bound ``G(T) + P R T`` at each of ``times`` (within the
        breakpoints' range)."""
        out: FloatArray = np.interp(times, self.times, self.costs) + self.ranks_power * times
        return out
