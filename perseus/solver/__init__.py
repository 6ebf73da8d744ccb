"""The iteration time-energy frontier by iterative min-cut (Phillips-Dessouky with exact steps).

Problem. Every DAG node ``i`` (one instruction) runs at one of its measured frequencies; option
``j`` takes ``t_ij`` seconds and ``e_ij`` joules. For an iteration time ``T`` on ``R`` GPUs the
energy of a plan is ``sum_i e_i + P (R T - sum_i t_i)`` (``P``: blocking power), i.e.
``P R T + sum_i c_i`` with the *effective* cost ``c = e - P t``. The frontier is, for every ``T``
between the fastest and the cheapest plan, the plan of least energy finishing within ``T``.

Relaxation (:mod:`perseus.solver.relaxation`). Each node's Pareto-optimal options in (time,
effective cost) are replaced by the lower convex hull of those points, a convex, decreasing,
piecewise-linear cost ``c_i(d)`` of a continuous duration ``d``. Minimising ``sum_i c_i(d_i)``
subject to the longest path being at most ``T`` is a linear program (the project time-cost
trade-off problem) whose optimum ``G(T)`` is convex and piecewise linear in ``T``;
``G(T) + P R T`` is a certified lower bound on the energy of any discrete plan within ``T``.

Algorithm. :func:`solve_problem` runs these stages (:mod:`perseus.solver.stages`), the numeric
work in compiled kernels (:mod:`perseus.kernels`):

1. *relax*: from the longest durations (the optimum for every ``T`` at or above their longest
   path), the iteration time is shortened along the exact relaxed frontier, as in Phillips &
   Dessouky (1977) and Fulkerson (1961): on the subgraph of critical nodes, a minimum *s-t* cut
   (with lower bounds; Dinic's max-flow, warm-started from the previous step) picks the nodes
   to shorten and those that may be lengthened back; its value is the slope of ``G``. Each
   step moves by the exact distance to the next event, so the number of max-flows is the
   number of breakpoints of ``G``, not of time quanta, and the relaxed frontier is exact up to
   floating point.
2. *seed candidates*: breakpoints spread over the frontier are rounded to measured options (a
   topological sweep onto the hull vertices around each relaxed duration, time saved carried
   to later nodes) and their slack reclaimed (nodes slowed into the idle gaps, steepest
   savings first) by :class:`Rounder`.
3. *refine*: between two consecutive plans found, the gap to the bound peaks just before the
   second one's time. Round after round, the intervals peaking highest are split at their
   middle (the relaxed optimum there rounded, the interval's own plan given the slack up to
   there); where the gap stays high, randomised and *diagonal* roundings search further. A
   diagonal rounding gives every instruction of one microbatch and kind the same threshold on
   every stage, and spreads the thresholds of successive microbatches evenly (golden-ratio
   steps from a random start): it mixes the two hull vertices the way the relaxation mixes
   them, by whole microbatches travelling through the pipeline, so that the ranks' delays line
   up by microbatch rather than add up along paths that zigzag between ranks. It lowers the
   worst gaps but does not remove that loss.
4. *search*: the zero-slowdown plan (the fastest), if still far from the bound, gets a
   large-neighbourhood search (ruin and recreate: slow instructions down, on one rank, in a
   band across the pipeline or along one microbatch's pass through the stages, and repair the
   overrun along the longest path; or speed some up; then reclaim the slack, keeping the result
   if it saves energy); more effort searches the worst intervals too.
5. *polish*: a local search of exchanges (speed one node up by one option, hand the float that
   frees to the moves that save most; keep it if it saves overall) improves a few plans.

Every candidate is re-evaluated exactly from the measurements and the Pareto set of (time,
energy with waiting) is kept (:mod:`perseus.solver.candidates`); each point reports the relaxed
bound ``G(T) + P R T`` at its own time. :class:`SolverOptions` sets how much work each stage
gets.

Complexity: one relaxed step costs a warm-started max-flow on at most ``2n + 4`` vertices and a
few ``O(n + m)`` longest-path passes (``n`` nodes, ``m`` edges); one rounding costs
``O(levels x (n + m))``, one pass of exchanges ``O(n x (n + m))`` (so only a few plans get
them), one search trial a rounding's cost plus, when it slows instructions down, a
longest-path pass per instruction it speeds up to repair the overrun. Python only orchestrates
chunks of steps and batches of candidates.

References: S. Phillips and M. I. Dessouky, "Solving the project time/cost tradeoff problem
using the minimal cut concept", Management Science 24(4) (1977); D. R. Fulkerson, "A network
flow computation for project cost curves", Management Science 7(2) (1961); E. A. Dinic (1970),
see :mod:`perseus.kernels.flow`; the frontier approach for pipeline training: J.-W. Chung et al.,
"Perseus: Reducing Energy Bloat in Large Model Training", SOSP '24.
"""

from __future__ import annotations

from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.options import RoundingOptions, SolverOptions
from perseus.solver.relaxation import Relaxation, RelaxedStep, relaxed_frontier
from perseus.solver.rounder import Rounder
from perseus.solver.solve import FirstPlan, first_plan, solve_frontier, solve_problem
from perseus.solver.stages import SEARCH_STARTS

__all__ = [
    "solve_frontier",
    "solve_problem",
    "first_plan",
    "FirstPlan",
    "SolverOptions",
    "RoundingOptions",
    "Rounder",
    "relaxed_frontier",
    "RelaxedStep",
    "RelaxedFrontier",
    "Relaxation",
    "SEARCH_STARTS",
]
