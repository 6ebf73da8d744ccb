"""Per-clock transfers: a tighter certified bound, and plans improved on the true model.

Problem. A transfer whose time depends on its producer's clock couples two DAG nodes: the
transfer node lasts ``tt(k)`` when the op that produced the data runs its option ``k``. The
relaxation (:mod:`perseus.solver.relaxation`) needs every node's cost to depend on its own
duration alone, so the bound is taken on :meth:`~perseus.problem.EnergyProblem.cost_charged`:
the shortest transfer, ``tt_min``, whatever the producer runs. That is certified but loose: a
slow producer pays nothing for the longer transfer it causes (measured: 0.25 % and 0.49 % below
the coupled problem's own LP relaxation at 1.02 and 1.05 T0 on a 4 x 12 GPT-3 A40 input).

Method (bound). Lagrangian relaxation of the coupling. Give the transfer node the producer's
options as its own (option ``k``: time ``tt(k)``) and add ``lambda_k`` to the producer's option
``k`` and ``-lambda_k`` to the transfer's: for a plan in which both choose the same ``k`` (every
real plan) durations and the sum of effective costs are the truth's, so the relaxation of this
*priced* model (:func:`priced`) is a certified lower bound for **any** prices. The prices here
are ``lambda_k = pi_j (tt(k) - tt_min)`` per transfer ``j`` (a slow producer is charged ``pi_j``
per second its transfer grows, the transfer rebated as much); the bound at a deadline ``T`` is
a concave function of ``pi``, raised by projected subgradient steps whose direction per
transfer is the transfer time its producer's relaxed duration implies less the transfer's own
relaxed duration (:func:`tighten`). The best of these priced relaxations at LP optimality is
the coupled problem's LP relaxation. Every priced sweep is a bound at every ``T``, so the
result is the maximum of all of them and the plain one (:func:`perseus.bound.envelope`).

Method (plans). For a plan ``x``, the *anchored* model (:func:`anchored`) keeps each transfer at
its time under ``x`` and charges a producer's option only the transfer time it adds beyond
that (at the blocking power, its effective cost the truth's): never faster than the truth for
any plan, equal to it at ``x``. Reclaiming and exchanges on it (:func:`improve_plans`) move
from ``x`` only to plans that are on time on the truth, seeing the rank the producer frees.

Complexity: :func:`tighten` runs ``deadlines x iterations`` relaxed sweeps (a budget bounded by
``sweep_work // n``); :func:`improve_plans` one hull build and one reclaim with exchanges per
plan and round.

Reference: M. L. Fisher, "The Lagrangian relaxation method for solving integer programming
problems", Management Science 27(1), 1981.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from perseus.bound import envelope
from perseus.problem import EnergyProblem
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.options import RoundingOptions
from perseus.solver.relaxation import Relaxation
from perseus.solver.rounder import Rounder

__all__ = ["DEADLINES", "Anchoring", "anchored", "improve_plans", "priced", "tighten", "truth"]

FloatArray = npt.NDArray[np.float64]
PlanArray = npt.NDArray[np.uint8]
Sweep = Callable[[EnergyProblem, Relaxation], RelaxedFrontier]

#: Deadlines (times the fastest relaxed time) at which the prices are raised.
DEADLINES = (1.01, 1.02, 1.035, 1.05, 1.075, 1.1, 1.15, 1.25)
#: Subgradient steps per deadline (fewer on large problems: see :func:`tighten`).
ITERATIONS = 10
#: Instructions x sweeps the tightening may spend (about a second of sweeps per 10k).
SWEEP_WORK = 20_000
#: A deadline's first prices, times the plain bound's slope there.
_START_PRICE = 0.1


def truth(problem: EnergyProblem) -> EnergyProblem:
    """The problem as measured.

    ``problem`` itself, or the truth behind a model of it
    (:meth:`~perseus.problem.EnergyProblem.producer_charged`, ``cost_charged``).
    """
    if problem.true_times is None or problem.true_energies is None:
        return problem
    return replace(
        problem,
        times=problem.true_times,
        energies=problem.true_energies,
        true_times=None,
        true_energies=None,
    )


def priced(problem: EnergyProblem, prices: FloatArray) -> EnergyProblem:
    """The bound's model with the producer-transfer coupling priced.

    Each per-clock transfer ``j`` is given its producer's options (option ``k``: the
    transfer's time at clock ``k``), ``prices[j] x (t_k - t_min)`` added to the producer's
    option ``k`` and taken from the transfer's. Built on
    :meth:`~perseus.problem.EnergyProblem.cost_charged` (the transfer's cost at each clock
    already charged to the producer). For every plan in which a transfer takes its producer's
    option (every real plan), durations and the sum of effective costs are the truth's.
    """
    problem = truth(problem)
    base = problem.cost_charged()
    times, energies = base.times.copy(), base.energies.copy()
    num, freqs = base.num_options.copy(), base.freqs.copy()
    pb = problem.blocking_power
    for j, (w, p) in enumerate(
        zip(problem.clocked_transfers.tolist(), problem.clocked_producers.tolist(), strict=True)
    ):
        tt = problem.clocked_times[j]
        t_min = times[w, 0]
        lam = float(prices[j]) * (tt - t_min)
        energies[p] = energies[p] + lam
        energies[w] = energies[w, 0] + pb * (tt - t_min) - lam
        times[w] = tt
        num[w], freqs[w] = num[p], freqs[p]
    if base.true_times is None:
        base = replace(base, true_times=problem.times, true_energies=problem.energies)
    return replace(base, times=times, energies=energies, num_options=num, freqs=freqs)


def _subgradient(problem: EnergyProblem, rel: Relaxation, durations: FloatArray) -> FloatArray:
    """The subgradient of the priced relaxation's value in the prices.

    Per transfer: the time its producer's relaxed duration implies (interpolated between the
    producer's hull vertices) less the transfer's own relaxed duration.
    """
    out = np.empty(len(problem.clocked_transfers))
    for j, (w, p) in enumerate(
        zip(problem.clocked_transfers.tolist(), problem.clocked_producers.tolist(), strict=True)
    ):
        vert = np.flatnonzero(rel.hull_mask[p])
        order = np.argsort(problem.times[p, vert], kind="stable")
        vert = vert[order]
        implied = np.interp(durations[p], problem.times[p, vert], problem.clocked_times[j, vert])
        out[j] = implied - durations[w]
    return out


def tighten(
    problem: EnergyProblem,
    plain: RelaxedFrontier,
    sweep: Sweep,
    *,
    deadlines: tuple[float, ...] = DEADLINES,
    iterations: int = ITERATIONS,
    sweep_work: int = SWEEP_WORK,
) -> RelaxedFrontier:
    """The bound's relaxed frontier ``plain`` raised by priced relaxations.

    The priced relaxations (:func:`priced`) have their prices found by projected subgradient
    ascent at ``deadlines`` (times ``plain``'s fastest time, those before its slowest): the
    result is the maximum of every sweep made and ``plain``,
    so never below ``plain`` and certified as each of them is. ``sweep`` relaxes a problem
    (the solver's own core and options). At most ``sweep_work // n`` sweeps (each deadline
    gets ``iterations`` or an equal share, at least 2; the deadlines thinned evenly when even
    that is too many). ``plain`` itself when no transfer is per-clock, and from ``sweep_work //
    4`` instructions (5,000 by default), where a few sweeps would cost several solves.
    """
    m = len(problem.clocked_transfers)
    if m == 0 or plain.t_max <= plain.t_min or plain.slopes.size:
        return plain  # nothing coupled, nothing to raise, or tangents (the sandwich core)
    budget = sweep_work // max(1, problem.num_nodes)
    if budget < 4:
        return plain  # a sweep there costs about what the whole solve does: not raised
    at = [f * plain.t_min for f in deadlines if f * plain.t_min < plain.t_max]
    while len(at) > 1 and 2 * len(at) > budget:
        at = at[::2]
    steps = max(2, min(iterations, budget // max(1, len(at))))
    pr = plain.ranks_power
    curves = [(plain.times, plain.costs + pr * plain.times)]
    for t in at:
        slope = abs(float(plain.relaxed_bound.slope(t)) - pr)
        pi = np.full(m, _START_PRICE * slope)
        rate = 0.0
        for it in range(steps):
            model = priced(problem, pi)
            rel = Relaxation.build(model)
            rf = sweep(model, rel)
            if rf.slopes.size:
                break
            curves.append((rf.times, rf.costs + pr * rf.times))
            g = _subgradient(model, rel, rf.durations_at(np.array([t]))[0])
            if not np.any(g):
                break
            if it == 0:
                rate = _START_PRICE * max(slope, 1e-9) / float(np.abs(g).max())
            pi = np.maximum(0.0, pi + rate / np.sqrt(it + 1) * g)
    times, values = envelope(_useful(curves, pr), pr)
    return replace(plain, times=times, costs=values - pr * times)


def _useful(
    curves: list[tuple[FloatArray, FloatArray]], pr: float
) -> list[tuple[FloatArray, FloatArray]]:
    """The curves that are the highest somewhere on a grid of their common range.

    The others add nothing to the maximum there, and little between grid points.
    """
    lo = max(float(t[0]) for t, _ in curves)
    hi = max(float(t[-1]) for t, _ in curves)
    grid = np.linspace(lo, hi, 2048)
    vals = []
    for t, v in curves:
        y = np.interp(grid, t, v)
        past = grid > t[-1]
        y[past] = v[-1] + pr * (grid[past] - t[-1])
        vals.append(y)
    best = set(np.argmax(np.array(vals), axis=0).tolist()) | {0}
    return [curves[i] for i in sorted(best)]


def anchored(problem: EnergyProblem, plan: PlanArray) -> EnergyProblem:
    """A model exact at ``plan`` and never faster than the truth elsewhere.

    Each per-clock transfer is at its time under ``plan``, each producer's option ``k`` longer by
    what its transfer would add beyond that (at the blocking power), effective costs the truth's
    (each transfer's cost at its producer's clock charged to the producer). ``problem`` is the
    truth, or a model of it (:meth:`~perseus.problem.EnergyProblem.evaluate_many` still gives the
    truth).
    """
    problem = truth(problem)
    base = problem.cost_charged()
    if not problem.clocked_transfers.size:
        return base
    times, energies = base.times.copy(), base.energies.copy()
    pb = problem.blocking_power
    plan = np.asarray(plan, dtype=np.int64)
    for j, (w, p) in enumerate(
        zip(problem.clocked_transfers.tolist(), problem.clocked_producers.tolist(), strict=True)
    ):
        tt = problem.clocked_times[j]
        a = float(tt[plan[p]])
        excess = float(problem.clocked_power[j]) - pb
        # the transfer's own cost at the anchor; the producer's charge taken relative to it
        energies[p] -= excess * (a - times[w, 0])
        energies[w] = problem.clocked_power[j] * a
        times[w] = a
        extra = np.maximum(0.0, tt - a)
        times[p] += extra
        energies[p] += pb * extra
    true_t = problem.times if base.true_times is None else base.true_times
    true_e = problem.energies if base.true_energies is None else base.true_energies
    return replace(base, times=times, energies=energies, true_times=true_t, true_energies=true_e)


class Anchoring:
    """The :func:`anchored` models of one problem, fast.

    A :class:`Rounder` of the truth's cost-charged model is built once, and per plan only its times
    changed (the producers' and the transfers' rows). A producer's options keep their order when its
    transfer's extra time grows with its option's time (slower clocks, longer transfers), and their
    effective costs change by a constant, so the Pareto options are the same; otherwise a plan's
    model is built in full.
    """

    def __init__(self, problem: EnergyProblem, options: RoundingOptions | None = None) -> None:
        """Build the truth's rounder once (``problem``: the truth or a model of it)."""
        self.problem = truth(problem)
        self.options = options
        base = self.problem.cost_charged()
        self.rounder = Rounder(base, Relaxation.build(base), options)
        order = self.rounder.order
        self.producers = self.problem.clocked_producers
        self.transfers = self.problem.clocked_transfers
        # each transfer's time by its producer's option, and in its producer's sorted order
        self.tt = self.problem.clocked_times
        self.tt_sorted = np.take_along_axis(self.tt, order[self.producers], axis=1)

    def rounder_for(self, plan: PlanArray) -> Rounder:
        """The rounder of ``plan``'s anchored model."""
        plan = np.asarray(plan, dtype=np.int64)
        a = self.tt[np.arange(len(self.transfers)), plan[self.producers]]
        times = self.rounder.times.copy()
        extra = np.zeros_like(times)
        np.maximum.at(extra, self.producers, np.maximum(0.0, self.tt_sorted - a[:, None]))
        times += extra
        times[self.transfers] = a[:, None]
        nopt = self.rounder.nopt
        valid = np.arange(times.shape[1] - 1)[None, :] < (nopt - 1)[:, None]
        if (np.diff(times, axis=1)[valid] < 0).any():
            model = anchored(self.problem, plan)
            return Rounder(model, Relaxation.build(model), self.options)
        return self.rounder.with_times(times)


def improve_plans(
    problem: EnergyProblem | Anchoring,
    plans: PlanArray,
    deadlines: FloatArray,
    *,
    rounds: int = 3,
    passes: int = 2,
    trials: int = 0,
    seeds: npt.NDArray[np.int64] | None = None,
    options: RoundingOptions | None = None,
) -> PlanArray:
    """Plans improved on their anchored models, each within its deadline.

    Each of ``plans`` is given the slack up to its deadline and improved by ``passes`` passes
    of exchanges on its :func:`anchored` model, then ``trials // rounds`` trials of the
    large-neighbourhood search (seeded by ``seeds``) if ``trials``, re-anchored up to ``rounds``
    times while that lowers its true energy. Every plan out is on time on the truth when its
    plan in was (the anchored model is never faster than the truth); the rows keep their
    order.
    """
    anchoring = problem if isinstance(problem, Anchoring) else Anchoring(problem, options)
    problem = anchoring.problem
    out = np.array(plans, dtype=np.uint8, copy=True)
    for r in range(len(out)):
        best = out[r]
        t, e = problem.evaluate_many(best[None, :])
        limit = float(deadlines[r])
        for k in range(rounds):
            rounder = anchoring.rounder_for(best)
            new = rounder.exchange(best[None, :], np.array([limit]), passes)
            if trials > 0:
                seed = 0 if seeds is None else int(seeds[r])
                new = rounder.search(new, np.array([limit]), np.array([seed + k]), trials // rounds)
            nt, ne = problem.evaluate_many(new)
            if not (ne[0] < e[0] - 1e-12 * abs(e[0]) and nt[0] <= limit * (1 + 1e-12)):
                break
            best, e = new[0], ne
        out[r] = best
    return out
