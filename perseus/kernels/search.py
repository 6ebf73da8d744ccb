"""Large-neighbourhood search (ruin and recreate) on one plan within its deadline.

Problem. As in :mod:`perseus.kernels.exchange`: lower a plan's effective cost without passing its
deadline. Here the plan that matters most is the zero-slowdown one (what a pipeline without
stragglers runs), worth far more search than any other.

Method. Each trial perturbs a copy of the plan and recreates it: half the trials slow
instructions down (a run on one rank by a few options, or to their next slower hull vertex; a
band across the pipeline at one moment; a *diagonal*, one microbatch's pass through a run of
stages) and :func:`repair` the overrun by speeding others up along the longest path, cheapest
per second saved first; the rest speed instructions up (in a time window, a run on one rank, or
a scattered few) to free time to hand out afresh. Every trial then reclaims its slack
(:func:`perseus.kernels.rounding.reclaim`, with a random price schedule) and is kept when its
energy is lower. Jumps to hull vertices cross options that lie above the hull's chord, which no
step of a few options would be kept for. :func:`search_plans` runs this on rows of plans, each
row's generator seeded on its own, so results do not depend on how rows are split over threads.

Complexity: one trial costs a reclaim, ``O(levels x rounds x (nK + m))`` for ``n`` nodes, ``m``
edges and at most ``K`` options a node, plus, when it slows instructions down, an ``O(n + m)``
longest-path pass per speed-up the repair makes.

References: P. Shaw, "Using constraint programming and local search methods to solve vehicle
routing problems", CP-98, LNCS 1520 (1998), 417-431; G. Schrimpf, J. Schneider, H. Stamm-Wilbrandt
and G. Dueck, "Record breaking optimization results using the ruin and recreate principle",
Journal of Computational Physics 159(2) (2000), 139-171.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perseus.kernels.longest_paths import earliest_start_into
from perseus.kernels.rounding import reclaim, top_rate

__all__ = ["repair", "search_plans"]


@njit(cache=True, nogil=True)
def repair(dag, ts, cs, deadline, forced, pick, cur, es):
    """Speed up nodes of a plan that overruns ``deadline`` until it fits; returns whether it fits.

    ``pick``/``cur`` change in place; ``es`` is scratch space; nodes with ``forced`` set stay as
    they are. Each step follows one longest path back from its end and, on it, makes the
    speed-up that costs least per second saved, among each node's faster options up to the first
    that covers the overrun (options between hull vertices lie above the hull: the next faster
    one alone can look cheap and then leave a costly jump for the rest).
    """
    topo, pred_ptr, pred_idx = dag[0], dag[1], dag[2]
    n = pick.shape[0]
    eps = 1e-12 * deadline
    while True:
        earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
        end = -1
        t_end = -np.inf
        for v in range(n):
            if es[v] + cur[v] > t_end:
                t_end = es[v] + cur[v]
                end = v
        over = t_end - deadline
        if over <= eps:
            return True
        best = -1
        best_j = -1
        best_rate = np.inf
        v = end
        while v >= 0:
            p = pick[v]
            if not forced[v] and p > 0:
                for j in range(p - 1, -1, -1):
                    r = (cs[v, j] - cs[v, p]) / (ts[v, p] - ts[v, j])
                    if r < best_rate:
                        best_rate = r
                        best = v
                        best_j = j
                    if ts[v, p] - ts[v, j] >= over - eps:
                        break
            # the predecessor this node waited for
            u = -1
            for q in range(pred_ptr[v], pred_ptr[v + 1]):
                w = pred_idx[q]
                if es[w] + cur[w] >= es[v] - eps:
                    u = w
                    break
            v = u
        if best < 0:
            return False
        pick[best] = best_j
        cur[best] = ts[best, best_j]


@njit(cache=True, nogil=True)
def _plan_cost(cs, pick):
    total = 0.0
    for v in range(pick.shape[0]):
        total += cs[v, pick[v]]
    return total


@njit(cache=True, nogil=True)
def _next_vertex(hull, nopt, v, p):
    """Position of node ``v``'s next hull vertex slower than position ``p``.

    ``p`` itself at the slowest.
    """
    j = p + 1
    while j < nopt[v] - 1 and not hull[v, j]:
        j += 1
    return min(j, nopt[v] - 1)


@njit(cache=True, nogil=True)
def _slower(hull, nopt, v, p, vertex, k):
    """Node ``v`` slowed from position ``p``: to its next slower hull vertex, or by ``k`` options.

    Both stop at the slowest.
    """
    if vertex:
        return _next_vertex(hull, nopt, v, p)
    return min(p + k, nopt[v] - 1)


@njit(cache=True, nogil=True)
def _search(dag, ts, cs, nopt, hull, rank_ptr, diag, deadline, iters, top, pick):
    """Large-neighbourhood search on a plan within ``deadline``; returns its total effective cost.

    ``pick`` changes in place; the caller seeds numba's generator. Each of ``iters`` trials
    perturbs a copy of the plan, reclaims its slack (:func:`reclaim`, with a random price
    schedule) and keeps it when its energy is lower. Half the trials slow instructions down and
    repair the overrun by speeding up others (:func:`repair`): 1-4 consecutive instructions of
    one rank by 1-5 options each; every instruction, or every other one, of a run of up to 8 on
    one rank to its next slower hull vertex (``hull``: flags in the sorted options); a band
    across the pipeline (on each of a random run of ranks, the instruction running at one random
    moment); or a diagonal (the same pass of 1-2 microbatches on a run of consecutive stages, as
    it travels through the pipeline: ``diag[stage, kind, microbatch]`` is its node, -1 for
    none). Bands and diagonals move each instruction by the same 1-5 options or to its next
    slower hull vertex. A diagonal slows one microbatch's pass as a whole. The jumps to hull
    vertices cross options that lie above the hull's chord, which no step of a few options would
    be kept for. The rest of the trials speed instructions up by 1-3 options, freeing time to
    hand out afresh: those running in a random window of up to 5 % of the deadline, a run on one
    rank, or a scattered few. ``rank_ptr`` delimits each rank's instructions (numbered rank by
    rank, in execution order). Returns the plan's total effective cost.
    """
    n = pick.shape[0]
    ranks = rank_ptr.shape[0] - 1
    free = np.full(n, np.inf)
    cand = pick.copy()
    cur = np.empty(n)
    es = np.empty(n)
    forced = np.zeros(n, np.bool_)
    best = _plan_cost(cs, pick)
    for _trial in range(iters):
        cand[:] = pick
        r = np.random.randint(ranks)
        a, b = rank_ptr[r], rank_ptr[r + 1]
        if b == a:
            continue
        u = np.random.random()
        if u < 0.5:
            if u < 0.125:
                # a run of 1-4 instructions on one rank
                w = np.random.randint(1, min(4, b - a) + 1)
                s = np.random.randint(a, b - w + 1)
                for v in range(s, s + w):
                    cand[v] = min(cand[v] + np.random.randint(1, 6), nopt[v] - 1)
                    forced[v] = True
            elif u < 0.25:
                # every instruction, or every other one, of a run of up to 8 on one rank
                # to its next slower hull vertex: past options above the hull's chord, that
                # no step of a few options would be kept for
                w = np.random.randint(1, min(8, b - a) + 1)
                s = np.random.randint(a, b - w + 1)
                step = np.random.randint(1, 3)
                for v in range(s, s + w, step):
                    cand[v] = _next_vertex(hull, nopt, v, cand[v])
                    forced[v] = True
            elif u < 0.375:
                # a band across the pipeline: on each of a run of ranks, what runs at one moment
                for v in range(n):
                    cur[v] = ts[v, cand[v]]
                earliest_start_into(dag[0], dag[1], dag[2], cur, es)
                at = deadline * np.random.random()
                k = np.random.randint(1, 6)
                vertex = np.random.random() < 0.5
                q0 = np.random.randint(ranks)
                q1 = np.random.randint(q0, ranks) + 1
                for q in range(q0, q1):
                    for v in range(rank_ptr[q], rank_ptr[q + 1]):
                        if es[v] + cur[v] > at:
                            cand[v] = _slower(hull, nopt, v, cand[v], vertex, k)
                            forced[v] = True
                            break
            else:
                # a diagonal: the same pass (forward, backward, ...) of 1-2 microbatches on a
                # run of consecutive stages, as it travels through the pipeline
                c = np.random.randint(diag.shape[1])
                mb = np.random.randint(diag.shape[2])
                w = np.random.randint(1, 3)
                s0 = np.random.randint(diag.shape[0])
                s1 = np.random.randint(s0, diag.shape[0]) + 1
                k = np.random.randint(1, 6)
                vertex = np.random.random() < 0.5
                for q in range(s0, s1):
                    for x in range(mb, min(mb + w, diag.shape[2])):
                        v = diag[q, c, x]
                        if v >= 0:
                            cand[v] = _slower(hull, nopt, v, cand[v], vertex, k)
                            forced[v] = True
            for v in range(n):
                cur[v] = ts[v, cand[v]]
            ok = repair(dag, ts, cs, deadline, forced, cand, cur, es)
            forced[:] = False
            if not ok:
                continue
        elif u < 0.625:
            # speed up a band across the pipeline
            for v in range(n):
                cur[v] = ts[v, cand[v]]
            earliest_start_into(dag[0], dag[1], dag[2], cur, es)
            at = deadline * np.random.random()
            span = deadline * 0.05 * np.random.random()
            for v in range(n):
                if es[v] + cur[v] > at and es[v] < at + span:
                    cand[v] = max(cand[v] - np.random.randint(1, 4), 0)
        elif u < 0.75:
            w = np.random.randint(2, max(3, (b - a) // 2))
            s = np.random.randint(a, max(a + 1, b - w + 1))
            for v in range(s, min(s + w, b)):
                cand[v] = max(cand[v] - np.random.randint(1, 4), 0)
        else:
            for _k in range(np.random.randint(2, max(3, n // 8))):
                v = np.random.randint(n)
                cand[v] = max(cand[v] - np.random.randint(1, 4), 0)
        levels = np.random.randint(4, 16)
        decay = 0.5 + 0.4 * np.random.random()
        reclaim(dag, ts, cs, nopt, deadline, levels, decay, True, 8, top, free, cand)
        c = _plan_cost(cs, cand)
        if c < best - 1e-12 * abs(best):
            best = c
            pick[:] = cand
    return best


@njit(cache=True, nogil=True)
def search_plans(
    dag, ts, cs, nopt, hull, rank_ptr, diag, picks, deadlines, iters, seeds, levels, decay
):
    """Reclaim then search: rows of ``picks`` given their slack and improved by :func:`_search`.

    ``picks`` holds plans as positions in the sorted options; each row is given the slack up to
    its deadline (:func:`reclaim`) and then improved by :func:`_search` (``iters`` trials,
    numba's generator seeded with ``seeds[r]`` for row ``r``, so results do not depend on how
    rows are split over threads).
    """
    out = picks.copy()
    top = top_rate(ts, cs, nopt)
    free = np.full(out.shape[1], np.inf)
    for r in range(out.shape[0]):
        reclaim(dag, ts, cs, nopt, deadlines[r], levels, decay, True, 8, top, free, out[r])
        np.random.seed(seeds[r])
        _search(dag, ts, cs, nopt, hull, rank_ptr, diag, deadlines[r], iters, top, out[r])
    return out
