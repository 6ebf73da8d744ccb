"""An independent LP of the continuous relaxation of the energy-scheduling problem.

Solved with scipy's HiGHS: the test oracle for the solver's certified lower bounds.

For a deadline ``T`` it computes::

    L(T) = min  sum_i z_i + P * R * T
           s.t. z_i >= s_ik * d_i + b_ik        for every segment k of node i's cost hull
                lo_i <= d_i <= hi_i             (fastest .. slowest Pareto option of node i)
                x_j >= x_i + d_i                for every DAG edge i -> j
                x_i + d_i <= T,  x_i >= 0

where node ``i``'s cost hull is the lower convex hull of its options' ``(time, energy - P *
time)`` points, after dropping the options dominated in that effective cost (``P`` is the
blocking power, ``R`` the number of ranks).

Why it bounds every discrete plan: the energy of a plan that finishes by ``T`` and then waits,
paying blocking power, until ``T`` is ``sum_i (e_i - P t_i) + P R T``. A dominated option can be
swapped for the one dominating it without making the plan slower or costlier, and the hull lies
below every Pareto option, so the plan's ``(d, z)`` is feasible for the LP with no larger
objective. It is built from :mod:`perseus.profiles` helpers and the DAG's edge lists only, never
from the solver.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.optimize import linprog

from perseus.errors import InfeasibleError
from perseus.problem import EnergyProblem
from perseus.profiles import lower_hull_indices, pareto_indices

__all__ = ["LPSolution", "LPRelaxation", "lp_lower_bound", "node_hulls"]

FloatArray = npt.NDArray[np.float64]
#: Relative slack allowed when checking a deadline against the fastest iteration time.
FEASIBILITY_TOL = 1e-9


@dataclass(frozen=True)
class LPSolution:
    """Optimum of the relaxation at one deadline.

    Attributes:
        deadline: ``T``.
        value: ``L(T)``, the lower bound on the energy (J) of any plan finishing by ``T``
            (blocking power paid until ``T``).
        durations: optimal continuous duration of every node.
        starts: their start times.
        compute_cost: ``sum_i c_i(d_i)``, the effective compute cost part of ``value``.
        slope: ``dL/dT`` from HiGHS's duals of the deadline rows, plus ``P R``: a subgradient
            of ``L`` at ``deadline`` (the slope of a supporting line there).
    """

    deadline: float
    value: float
    durations: FloatArray
    starts: FloatArray
    compute_cost: float
    slope: float


def node_hulls(problem: EnergyProblem) -> list[tuple[FloatArray, FloatArray]]:
    """Per node, the ``(times, effective costs)`` of its cost hull's vertices, by increasing time."""
    p = problem.blocking_power
    hulls = []
    for i in range(problem.num_nodes):
        k = int(problem.num_options[i])
        t = problem.times[i, :k]
        c = problem.energies[i, :k] - p * t
        par = pareto_indices(t, c)
        tp, cp = t[par], c[par]
        hull = lower_hull_indices(tp, cp)
        hulls.append((tp[hull].astype(np.float64), cp[hull].astype(np.float64)))
    return hulls


def hull_cost(times: FloatArray, costs: FloatArray, d: float) -> float:
    """The hull's value at duration ``d`` (linear interpolation between vertices)."""
    return float(np.interp(d, times, costs))


class LPRelaxation:
    """The relaxation of one problem.

    The constraint matrix is built once and reused for every deadline (only the right-hand side
    depends on ``T``).

    Variables are ordered ``[x (n), d (n), z (n)]``.
    """

    def __init__(self, problem: EnergyProblem) -> None:
        self.problem = problem
        n = problem.num_nodes
        self.hulls = node_hulls(problem)
        self.fastest = np.array([h[0][0] for h in self.hulls])
        self.slowest = np.array([h[0][-1] for h in self.hulls])
        self.min_time = float(problem.dag.iteration_time(self.fastest))
        self.cheapest_time = float(problem.dag.iteration_time(self.slowest))
        self.min_compute_cost = float(sum(h[1][-1] for h in self.hulls))

        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        rhs: list[float] = []
        r = 0
        # precedence: x_i + d_i - x_j <= 0
        for i, j in zip(problem.dag.src.tolist(), problem.dag.dst.tolist(), strict=True):
            rows += [r, r, r]
            cols += [i, n + i, j]
            vals += [1.0, 1.0, -1.0]
            rhs.append(0.0)
            r += 1
        # deadline: x_i + d_i <= T (rhs filled per solve)
        self._deadline_rows = slice(r, r + n)
        for i in range(n):
            rows += [r, r]
            cols += [i, n + i]
            vals += [1.0, 1.0]
            rhs.append(0.0)
            r += 1
        # epigraph: s * d_i - z_i <= -b for every hull segment
        for i, (t, c) in enumerate(self.hulls):
            for k in range(len(t) - 1):
                s = (c[k + 1] - c[k]) / (t[k + 1] - t[k])
                b = c[k] - s * t[k]
                rows += [r, r]
                cols += [n + i, 2 * n + i]
                vals += [s, -1.0]
                rhs.append(-b)
                r += 1
        self._a_ub = sp.csr_matrix((vals, (rows, cols)), shape=(r, 3 * n))
        self._b_ub = np.asarray(rhs, dtype=np.float64)
        # a node with a single Pareto option has z_i fixed by its bound
        self._bounds = (
            [(0.0, None)] * n
            + [(float(lo), float(hi)) for lo, hi in zip(self.fastest, self.slowest, strict=True)]
            + [
                (float(h[1][-1]), None) if len(h[0]) > 1 else (float(h[1][0]), float(h[1][0]))
                for h in self.hulls
            ]
        )
        self._c = np.concatenate([np.zeros(2 * n), np.ones(n)])

    def check_deadline(self, deadline: float) -> None:
        """Raise :class:`InfeasibleError` if no plan can finish by ``deadline``."""
        if not np.isfinite(deadline) or deadline < self.min_time * (1 - FEASIBILITY_TOL):
            raise InfeasibleError(
                f"deadline {deadline!r} s is below the fastest possible iteration time "
                f"{self.min_time:.6f} s"
            )

    def solve(self, deadline: float) -> LPSolution:
        """``L(deadline)``; raises :class:`InfeasibleError` below the fastest iteration time."""
        self.check_deadline(deadline)
        n = self.problem.num_nodes
        # never ask for less than the fastest time (a hair below passes the tolerance above)
        t = max(float(deadline), self.min_time)
        b = self._b_ub.copy()
        b[self._deadline_rows] = t
        res = linprog(self._c, A_ub=self._a_ub, b_ub=b, bounds=self._bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"HiGHS failed at deadline {deadline}: {res.message}")
        x = res.x
        compute = float(res.fun)
        p, ranks = self.problem.blocking_power, self.problem.dag.num_ranks
        return LPSolution(
            deadline=float(deadline),
            value=compute + p * ranks * float(deadline),
            durations=x[n : 2 * n].copy(),
            starts=x[:n].copy(),
            compute_cost=compute,
            slope=p * ranks + float(res.ineqlin.marginals[self._deadline_rows].sum()),
        )


def lp_lower_bound(problem: EnergyProblem, deadline: float) -> LPSolution:
    """One-shot :meth:`LPRelaxation.solve`."""
    return LPRelaxation(problem).solve(deadline)
