"""Rounding relaxed durations to measured options, and reclaiming a plan's slack.

Problem. The relaxation (:mod:`perseus.kernels.relaxed`) gives each node a continuous duration
between two vertices of its convex hull; a plan must pick one measured option per node and still
finish by the deadline, at the least effective cost ``sum_i (e_i - P t_i)``. That discrete
time-cost trade-off is strongly NP-hard, so these are heuristics; the relaxation's value is the
certified bound they are measured against.

Options arrive pre-sorted per node by increasing time (so decreasing effective cost): ``ts``,
``cs`` and ``hs`` hold each node's Pareto options' times, effective costs and hull-vertex flags,
``nopt`` how many it has; plans are positions in that order (``pick``).

Method. :func:`_round` sweeps the nodes in topological order, putting each on one of the two hull
vertices around its relaxed duration (the slower one when it fits and the duration is past
``up_at[v]`` of the way there: 0.5 is the nearer vertex, random values give randomised rounding).
Latest finishes come from the relaxed durations, whose descendants are still relaxed, so every
choice keeps the plan within the deadline and time saved by rounding down is carried to later
nodes. :func:`reclaim` then slows nodes into the plan's idle gaps, alternating forward sweeps
(against latest finishes) and backward sweeps (against earliest starts), each node moving to the
slowest option that fits and saves at least the current price per second of extra time; the
price falls geometrically from the steepest saving (:func:`top_rate`) over ``levels`` levels, so
the steepest savings get the slack first. :func:`round_and_reclaim` and :func:`reclaim_plans`
run these (and :func:`perseus.kernels.exchange.exchange`) on batches of plans.

Complexity, for ``n`` nodes, ``m`` edges and at most ``K`` options a node: a rounding is
``O(nK + m)``; a reclaim ``O(levels x max_rounds x (nK + m))``.

References: the discrete problem's hardness: P. De, E. J. Dunne, J. B. Ghosh and C. E. Wells,
"Complexity of the discrete time-cost tradeoff problem for project networks", Operations
Research 45(2) (1997), 302-306; randomised rounding: P. Raghavan and C. D. Thompson, "Randomized
rounding: a technique for provably good algorithms and algorithm proofs", Combinatorica 7(4)
(1987), 365-374.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perseus.kernels.exchange import exchange
from perseus.kernels.longest_paths import (
    earliest_start_into,
    latest_finish,
    latest_finish_into,
    ready_time,
)

__all__ = ["top_rate", "reclaim", "round_and_reclaim", "reclaim_plans"]


@njit(cache=True, nogil=True)
def _best_jump(ts, cs, v, nopt, p, limit, theta, jump):
    """The slowest option of node ``v`` after position ``p`` that fits and saves enough; else ``p``.

    Only the next option is looked at unless ``jump``; the option must fit in ``limit`` and save
    at least ``theta`` per second of extra time (``p`` when none does).
    """
    best = p
    t0 = ts[v, p]
    c0 = cs[v, p]
    last = nopt if jump else min(nopt, p + 2)
    for j in range(p + 1, last):
        t = ts[v, j]
        if t > limit:
            break
        if c0 - cs[v, j] >= theta * (t - t0):
            best = j
    return best


@njit(cache=True, nogil=True)
def _round(dag, ts, hs, nopt, d, deadline, up_at, pick, cap):
    """Round relaxed durations ``d`` to measured options within ``deadline`` (into ``pick``).

    Sweeps the nodes in topological order. The latest finish of every node is computed once
    from the relaxed durations; since a node's descendants are still relaxed when it is
    rounded, any option that ends by that latest finish keeps the whole plan within the
    deadline. Time saved by rounding a node down is thus carried to later nodes, which may
    round up. Each node goes to one of the two hull vertices around its relaxed duration
    (mixing those is what the relaxation does): the slower one if it fits and the duration is
    more than ``up_at[v]`` of the way to it (0.5: the nearer vertex; random: randomised
    rounding), else the faster one. ``cap[v]`` gets the time of the hull vertex at or above
    the relaxed duration, for :func:`reclaim`.
    """
    topo, pred_ptr, pred_idx, succ_ptr, succ_idx = dag
    n = d.shape[0]
    lf = latest_finish(topo, succ_ptr, succ_idx, d, deadline)
    fin = np.zeros(n)
    eps = 1e-12 * deadline
    for v in topo:
        st = ready_time(pred_ptr, pred_idx, fin, v)
        window = lf[v] - st + eps
        p = 0
        up = -1
        lim = d[v] * (1 + 1e-12)
        for j in range(nopt[v]):
            if hs[v, j]:
                if ts[v, j] <= lim:
                    p = j
                elif up < 0:
                    up = j
        if ts[v, p] >= d[v] * (1 - 1e-12):
            cap[v] = ts[v, p] * (1 + 1e-12)  # the relaxed duration is a vertex
        elif up >= 0:
            cap[v] = ts[v, up] * (1 + 1e-12)
        else:
            cap[v] = np.inf
        if up >= 0:
            t_up = ts[v, up]
            if t_up <= window and d[v] - ts[v, p] > up_at[v] * (t_up - ts[v, p]):
                p = up
        pick[v] = p
        fin[v] = st + ts[v, p]


@njit(cache=True, nogil=True)
def top_rate(ts, cs, nopt):
    """The steepest saving per second of moving any node one option slower."""
    top = 0.0
    for v in range(nopt.shape[0]):
        for j in range(nopt[v] - 1):
            r = (cs[v, j] - cs[v, j + 1]) / (ts[v, j + 1] - ts[v, j])
            if r > top:
                top = r
    return top


@njit(cache=True, nogil=True)
def reclaim(dag, ts, cs, nopt, deadline, levels, decay, jump, max_rounds, top, cap, pick):
    """Slow the nodes of a plan within ``deadline`` into its idle gaps (``pick`` in place).

    Alternates forward sweeps (latest finishes from the current plan; nodes in topological
    order) and backward sweeps (earliest starts; reverse order), each moving every node to the
    slowest option that fits and saves at least the current price per second of extra time,
    until a sweep moves nothing; the price falls geometrically from ``top`` (see
    :func:`top_rate`) over ``levels`` levels, so the steepest savings get the slack first
    rather than whichever node comes first. No node is moved to an option slower than
    ``cap[v]``.
    """
    topo, pred_ptr, pred_idx, succ_ptr, succ_idx = dag
    n = pick.shape[0]
    cur = np.empty(n)
    for v in range(n):
        cur[v] = ts[v, pick[v]]
    fin = np.zeros(n)
    lst = np.empty(n)
    es = np.empty(n)
    lf = np.empty(n)
    eps = 1e-12 * deadline
    level = 0
    while level <= levels:
        # The best saving rate any single move could still get within its node's total float:
        # levels priced above it have nothing to do, so skip straight past them.
        earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
        latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
        best_rate = -1.0
        for v in range(n):
            p = pick[v]
            room = min(lf[v] - es[v] + eps, cap[v])
            for j in range(p + 1, nopt[v]):
                if ts[v, j] > room:
                    break
                r = (cs[v, p] - cs[v, j]) / (ts[v, j] - ts[v, p])
                if r > best_rate:
                    best_rate = r
        if best_rate < 0.0:
            break
        while level < levels and top * decay ** (level + 1) > best_rate:
            level += 1
        theta = 0.0 if level == levels else top * decay ** (level + 1)
        level += 1
        for rnd in range(max_rounds):
            moved = 0
            if rnd % 2 == 0:
                if rnd > 0:
                    latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
                for v in topo:
                    st = ready_time(pred_ptr, pred_idx, fin, v)
                    lim = min(lf[v] - st + eps, cap[v])
                    p = _best_jump(ts, cs, v, nopt[v], pick[v], lim, theta, jump)
                    if p != pick[v]:
                        pick[v] = p
                        cur[v] = ts[v, p]
                        moved += 1
                    fin[v] = st + cur[v]
            else:
                # the forward sweep left every finish current: fin is the earliest finish
                for i in range(n - 1, -1, -1):
                    v = topo[i]
                    end = deadline
                    for q in range(succ_ptr[v], succ_ptr[v + 1]):
                        w = succ_idx[q]
                        if lst[w] < end:
                            end = lst[w]
                    start = fin[v] - cur[v]
                    lim = min(end - start + eps, cap[v])
                    p = _best_jump(ts, cs, v, nopt[v], pick[v], lim, theta, jump)
                    if p != pick[v]:
                        pick[v] = p
                        cur[v] = ts[v, p]
                        moved += 1
                    lst[v] = end - cur[v]
            # a sweep that moves nothing leaves no move at this price anywhere: each node was
            # offered its whole float
            if moved == 0:
                break


@njit(cache=True, nogil=True)
def round_and_reclaim(
    dag,
    ts,
    cs,
    hs,
    nopt,
    durations,
    deadlines,
    up_at,
    jumps,
    levels,
    decay,
    free_levels,
    free_decay,
    max_rounds,
    exchange_passes,
):
    """Discrete plans for rows of relaxed ``durations`` ``(k, n)``, each within its deadline.

    ``ts``, ``cs`` and ``hs`` hold every node's Pareto options by increasing time (hence
    decreasing effective cost): their times, effective costs and whether each is a hull
    vertex; ``nopt`` counts them. Each row is rounded (:func:`_round`) and its slack reclaimed
    (:func:`reclaim`, options skipped over when ``jumps[r]``) twice: first no node beyond the
    hull vertex at or above its relaxed duration (slack goes back where the relaxed optimum
    spends time; ``levels`` price levels falling by ``decay``), then freely (what is left, in
    ``free_levels`` levels falling by ``free_decay``). Up to ``exchange_passes`` passes of
    :func:`exchange` follow. Returns positions in those sorted options.
    """
    k, n = durations.shape
    out = np.empty((k, n), np.int64)
    top = top_rate(ts, cs, nopt)
    free = np.full(n, np.inf)
    cap = np.empty(n)
    for r in range(k):
        pick = out[r]
        _round(dag, ts, hs, nopt, durations[r], deadlines[r], up_at[r], pick, cap)
        # first only back up to the hull vertex above the relaxed duration, then freely
        reclaim(
            dag, ts, cs, nopt, deadlines[r], levels, decay, jumps[r], max_rounds, top, cap, pick
        )
        reclaim(
            dag, ts, cs, nopt, deadlines[r], free_levels, free_decay, jumps[r], max_rounds, top,
            free, pick,
        )  # fmt: skip
        if exchange_passes > 0:
            exchange(dag, ts, cs, nopt, deadlines[r], exchange_passes, pick)
    return out


@njit(cache=True, nogil=True)
def reclaim_plans(dag, ts, cs, nopt, picks, deadlines, levels, decay, max_rounds, exchange_passes):
    """Reclaim then exchange: rows of ``picks`` given their slack and improved.

    ``picks`` holds plans as positions in the sorted options; each row is given the slack up to
    its deadline (:func:`reclaim`) and improved by :func:`exchange`.
    """
    out = picks.copy()
    top = top_rate(ts, cs, nopt)
    free = np.full(out.shape[1], np.inf)
    for r in range(out.shape[0]):
        reclaim(dag, ts, cs, nopt, deadlines[r], levels, decay, True, max_rounds, top, free, out[r])
        if exchange_passes > 0:
            exchange(dag, ts, cs, nopt, deadlines[r], exchange_passes, out[r])
    return out
