"""Compiled inner loops of the solver (numba, cached on disk after the first compile).

Everything here works on flat integer/float arrays: the DAG as predecessor/successor CSR lists in
a topological order, and flow networks as arc arrays. No Python objects on the hot path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "earliest_start",
    "latest_finish",
    "earliest_start_k",
    "iteration_times",
    "min_cut_lower_bounds",
    "relaxed_chunk",
    "round_and_reclaim",
    "reclaim_plans",
    "search_plans",
]


@njit(cache=True, nogil=True)
def earliest_start(topo, pred_ptr, pred_idx, d):
    """Earliest start of every node (longest path from any source) for durations ``d``."""
    es = np.empty(d.shape[0])
    _earliest_start_into(topo, pred_ptr, pred_idx, d, es)
    return es


@njit(cache=True, nogil=True)
def latest_finish(topo, succ_ptr, succ_idx, d, deadline):
    """Latest finish of every node so that everything ends by ``deadline``."""
    lf = np.empty(d.shape[0])
    _latest_finish_into(topo, succ_ptr, succ_idx, d, deadline, lf)
    return lf


@njit(cache=True, nogil=True)
def _ready(pred_ptr, pred_idx, fin, v):
    """When node ``v`` can start: the latest finish ``fin`` among its predecessors."""
    st = 0.0
    for q in range(pred_ptr[v], pred_ptr[v + 1]):
        if fin[pred_idx[q]] > st:
            st = fin[pred_idx[q]]
    return st


@njit(cache=True, nogil=True)
def _earliest_start_into(topo, pred_ptr, pred_idx, d, es):
    for v in topo:
        best = 0.0
        for q in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[q]
            f = es[u] + d[u]
            if f > best:
                best = f
        es[v] = best


@njit(cache=True, nogil=True)
def _latest_finish_into(topo, succ_ptr, succ_idx, d, deadline, lf):
    for i in range(topo.shape[0] - 1, -1, -1):
        v = topo[i]
        best = deadline
        for q in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[q]
            s = lf[w] - d[w]
            if s < best:
                best = s
        lf[v] = best


@njit(cache=True, nogil=True)
def earliest_start_k(topo, pred_ptr, pred_idx, d, a, tol):
    """Earliest finish of every node and, over the tight (longest) paths into it, the smallest
    sum of ``a`` along such a path (node itself included)."""
    n = d.shape[0]
    ef = np.zeros(n)
    ka = np.zeros(n)
    for v in topo:
        best = 0.0
        for q in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[q]
            if ef[u] > best:
                best = ef[u]
        kbest = 0.0
        first = True
        for q in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[q]
            if ef[u] >= best - tol and (first or ka[u] < kbest):
                kbest = ka[u]
                first = False
        ef[v] = best + d[v]
        ka[v] = kbest + a[v]
    return ef, ka


@njit(cache=True, nogil=True)
def _dinic(nn, ptr, to, cap, rev, frm, s, t, limit):
    """Dinic's max-flow on a residual graph given as arc arrays grouped by tail (``ptr``).
    ``cap`` is updated in place; returns the flow value (stops at ``limit``)."""
    level = np.empty(nn, np.int64)
    it = np.empty(nn, np.int64)
    queue = np.empty(nn, np.int64)
    path = np.empty(nn + 1, np.int64)
    flow = 0
    while flow < limit:
        level[:] = -1
        level[s] = 0
        qh = 0
        qt = 1
        queue[0] = s
        while qh < qt:
            u = queue[qh]
            qh += 1
            for a in range(ptr[u], ptr[u + 1]):
                v = to[a]
                if cap[a] > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    queue[qt] = v
                    qt += 1
        if level[t] < 0:
            break
        for u in range(nn):
            it[u] = ptr[u]
        while flow < limit:
            depth = 0
            u = s
            found = False
            while True:
                if u == t:
                    found = True
                    break
                advanced = False
                while it[u] < ptr[u + 1]:
                    a = it[u]
                    v = to[a]
                    if cap[a] > 0 and level[v] == level[u] + 1:
                        path[depth] = a
                        depth += 1
                        u = v
                        advanced = True
                        break
                    it[u] += 1
                if not advanced:
                    if depth == 0:
                        break
                    level[u] = -1  # dead end for this phase
                    depth -= 1
                    u = frm[path[depth]]
                    it[u] += 1
            if not found:
                break
            b = limit - flow
            for i in range(depth):
                c = cap[path[i]]
                if c < b:
                    b = c
            for i in range(depth):
                a = path[i]
                cap[a] -= b
                cap[rev[a]] += b
            flow += b
    return flow


@njit(cache=True, nogil=True)
def min_cut_lower_bounds(nn, tail, head, lo, hi, s, t, inf, flow):
    """Minimum ``s``-``t`` cut of a network whose arcs carry flow in ``[lo, hi]`` (integers;
    ``hi == inf`` is unbounded). The value of a cut is ``sum(hi of forward arcs) -
    sum(lo of backward arcs)``.

    ``flow`` is a starting flow per arc (clamped into ``[lo, hi]``; it need not conserve flow):
    warm-starting from the previous step's flow leaves little to augment. It is overwritten with
    a maximum flow.

    Returns ``(status, side)``: status 0 = found (``side[v]`` is True on the source side),
    1 = every cut is infinite, 2 = the lower bounds admit no feasible flow.
    """
    m = tail.shape[0]
    ss = nn
    tt = nn + 1
    total_nodes = nn + 2
    g = np.empty(m, np.int64)
    excess = np.zeros(nn, np.int64)
    for i in range(m):
        f = flow[i]
        if f < lo[i]:
            f = lo[i]
        if f > hi[i]:
            f = hi[i]
        g[i] = f
        excess[head[i]] += f
        excess[tail[i]] -= f
    # s and t are balanced by the return arc t -> s (any s-t flow value is fine)
    excess[s] += excess[t]
    excess[t] = 0
    nimb = 0
    for v in range(nn):
        if excess[v] != 0:
            nimb += 1
    # arcs: originals, one helper arc per imbalanced vertex, the t -> s return arc; plus reverses
    narcs = m + nimb + 1
    atail = np.empty(2 * narcs, np.int64)
    ahead = np.empty(2 * narcs, np.int64)
    acap = np.zeros(2 * narcs, np.int64)
    for i in range(m):
        atail[i] = tail[i]
        ahead[i] = head[i]
        acap[i] = hi[i] - g[i] if hi[i] < inf else inf
        acap[narcs + i] = g[i] - lo[i]
    k = m
    need = 0
    for v in range(nn):
        if excess[v] > 0:
            atail[k] = ss
            ahead[k] = v
            acap[k] = excess[v]
            need += excess[v]
            k += 1
        elif excess[v] < 0:
            atail[k] = v
            ahead[k] = tt
            acap[k] = -excess[v]
            k += 1
    ret = k
    atail[k] = t
    ahead[k] = s
    acap[k] = inf
    for i in range(narcs):  # reverses
        atail[narcs + i] = ahead[i]
        ahead[narcs + i] = atail[i]
    # group arcs by tail (counting sort)
    ptr = np.zeros(total_nodes + 1, np.int64)
    for j in range(2 * narcs):
        ptr[atail[j] + 1] += 1
    for u in range(total_nodes):
        ptr[u + 1] += ptr[u]
    fill = ptr[:-1].copy()
    pos_of = np.empty(2 * narcs, np.int64)
    for j in range(2 * narcs):
        pos_of[j] = fill[atail[j]]
        fill[atail[j]] += 1
    to = np.empty(2 * narcs, np.int64)
    frm = np.empty(2 * narcs, np.int64)
    cap = np.empty(2 * narcs, np.int64)
    rev = np.empty(2 * narcs, np.int64)
    for j in range(2 * narcs):
        q = pos_of[j]
        to[q] = ahead[j]
        frm[q] = atail[j]
        cap[q] = acap[j]
        rev[q] = pos_of[j + narcs] if j < narcs else pos_of[j - narcs]
    if need > 0:
        f = _dinic(total_nodes, ptr, to, cap, rev, frm, ss, tt, need)
        if f < need:
            return 2, np.zeros(nn, np.bool_)
    # drop the helper arcs and the return arc (both directions)
    for j in range(2 * narcs):
        if frm[j] >= nn or to[j] >= nn:
            cap[j] = 0
    rpos = pos_of[ret]
    cap[rpos] = 0
    cap[rev[rpos]] = 0
    f = _dinic(total_nodes, ptr, to, cap, rev, frm, s, t, inf)
    if f >= inf:
        return 1, np.zeros(nn, np.bool_)
    for i in range(m):  # the flow on arc i is lo + its reverse residual
        flow[i] = lo[i] + cap[pos_of[narcs + i]]
    side = np.zeros(nn, np.bool_)
    queue = np.empty(nn, np.int64)
    side[s] = True
    queue[0] = s
    qh = 0
    qt = 1
    while qh < qt:
        u = queue[qh]
        qh += 1
        for a in range(ptr[u], ptr[u + 1]):
            v = to[a]
            if v < nn and cap[a] > 0 and not side[v]:
                side[v] = True
                queue[qt] = v
                qt += 1
    return 0, side


@njit(cache=True, nogil=True)
def _best_jump(ts, cs, v, nopt, p, limit, theta, jump):
    """The slowest option of node ``v`` after position ``p`` (only the next one unless
    ``jump``) that fits in ``limit`` and saves at least ``theta`` per second of extra time
    (``p`` when none does)."""
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
    the relaxed duration, for :func:`_reclaim`.
    """
    topo, pred_ptr, pred_idx, succ_ptr, succ_idx = dag
    n = d.shape[0]
    lf = latest_finish(topo, succ_ptr, succ_idx, d, deadline)
    fin = np.zeros(n)
    eps = 1e-12 * deadline
    for v in topo:
        st = _ready(pred_ptr, pred_idx, fin, v)
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
def _top_rate(ts, cs, nopt):
    """The steepest saving per second of moving any node one option slower."""
    top = 0.0
    for v in range(nopt.shape[0]):
        for j in range(nopt[v] - 1):
            r = (cs[v, j] - cs[v, j + 1]) / (ts[v, j + 1] - ts[v, j])
            if r > top:
                top = r
    return top


@njit(cache=True, nogil=True)
def _reclaim(dag, ts, cs, nopt, deadline, levels, decay, jump, max_rounds, top, cap, pick):
    """Slow the nodes of a plan within ``deadline`` into its idle gaps (``pick`` in place).

    Alternates forward sweeps (latest finishes from the current plan; nodes in topological
    order) and backward sweeps (earliest starts; reverse order), each moving every node to the
    slowest option that fits and saves at least the current price per second of extra time,
    until a sweep moves nothing; the price falls geometrically from ``top`` (see
    :func:`_top_rate`) over ``levels`` levels, so the steepest savings get the slack first
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
        _earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
        _latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
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
                    _latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
                for v in topo:
                    st = _ready(pred_ptr, pred_idx, fin, v)
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
    (:func:`_reclaim`, options skipped over when ``jumps[r]``) twice: first no node beyond the
    hull vertex at or above its relaxed duration (slack goes back where the relaxed optimum
    spends time; ``levels`` price levels falling by ``decay``), then freely (what is left, in
    ``free_levels`` levels falling by ``free_decay``). Up to ``exchange_passes`` passes of
    :func:`_exchange` follow. Returns positions in those sorted options.
    """
    k, n = durations.shape
    out = np.empty((k, n), np.int64)
    top = _top_rate(ts, cs, nopt)
    free = np.full(n, np.inf)
    cap = np.empty(n)
    for r in range(k):
        pick = out[r]
        _round(dag, ts, hs, nopt, durations[r], deadlines[r], up_at[r], pick, cap)
        # first only back up to the hull vertex above the relaxed duration, then freely
        _reclaim(
            dag, ts, cs, nopt, deadlines[r], levels, decay, jumps[r], max_rounds, top, cap, pick
        )
        _reclaim(
            dag, ts, cs, nopt, deadlines[r], free_levels, free_decay, jumps[r], max_rounds, top,
            free, pick,
        )  # fmt: skip
        if exchange_passes > 0:
            _exchange(dag, ts, cs, nopt, deadlines[r], exchange_passes, pick)
    return out


@njit(cache=True, nogil=True)
def reclaim_plans(dag, ts, cs, nopt, picks, deadlines, levels, decay, max_rounds, exchange_passes):
    """Rows of ``picks`` (plans as positions in the sorted options) each given the slack up to
    its deadline (:func:`_reclaim`) and improved by :func:`_exchange`."""
    out = picks.copy()
    top = _top_rate(ts, cs, nopt)
    free = np.full(out.shape[1], np.inf)
    for r in range(out.shape[0]):
        _reclaim(
            dag, ts, cs, nopt, deadlines[r], levels, decay, True, max_rounds, top, free, out[r]
        )
        if exchange_passes > 0:
            _exchange(dag, ts, cs, nopt, deadlines[r], exchange_passes, out[r])
    return out


@njit(cache=True, nogil=True)
def relaxed_chunk(
    topo, pred_ptr, pred_idx, succ_ptr, succ_idx, src, dst,
    tau, cost, slope, nv, shortest, longest, d0, t_min, scale, inf, max_steps,
    node_flow, edge_flow, src_flow, snk_flow,
):  # fmt: skip
    """Up to ``max_steps`` steps of the min-cut iteration along the relaxed frontier, starting
    from relaxed durations ``d0`` (see ``perseus.solver``).

    Returns ``(times, costs, slopes, durations, d_next, done)``: per step the iteration time,
    the sum of relaxed effective costs, the cut value (``inf`` at the fastest point) and the
    durations; the durations to continue from; whether the fastest point was reached.

    ``node_flow`` / ``edge_flow`` / ``src_flow`` / ``snk_flow`` hold the maximum flow of the last
    step (per DAG node, DAG edge, source and sink arc) and are updated in place: each step's
    max-flow starts from the previous one, which is nearly maximum already.
    """
    n = d0.shape[0]
    d = d0.copy()
    out_t = np.empty(max_steps)
    out_g = np.empty(max_steps)
    out_s = np.empty(max_steps)
    out_d = np.empty((max_steps, n))
    kv = np.zeros(n, np.int64)
    on = np.zeros(n, np.bool_)
    u = np.empty(n)
    lo = np.empty(n)
    a = np.zeros(n)
    local = np.empty(n, np.int64)
    ne_all = src.shape[0]
    steps = 0
    done = False
    while steps < max_steps:
        # where every node sits on its hull: vertex index, snapped duration, marginal rates
        g = 0.0
        for i in range(n):
            tolv = 1e-12 * max(1.0, abs(d[i]))
            k = 0
            for h in range(nv[i]):
                if tau[i, h] <= d[i] + tolv:
                    k = h
            o = abs(d[i] - tau[i, k]) <= tolv
            if o:
                d[i] = tau[i, k]
            kv[i] = k
            on[i] = o
            if k < nv[i] - 1:
                g += cost[i, k] + slope[i, k] * (d[i] - tau[i, k])
            else:
                g += cost[i, k]
            if o:
                u[i] = np.inf if k == 0 else -slope[i, k - 1]
            else:
                u[i] = -slope[i, k]
            lo[i] = 0.0 if (o and k == nv[i] - 1) else -slope[i, k]
        es = earliest_start(topo, pred_ptr, pred_idx, d)
        T = 0.0
        for i in range(n):
            if es[i] + d[i] > T:
                T = es[i] + d[i]
        tol = 1e-9 * max(T, 1e-9)
        out_t[steps] = T
        out_g[steps] = g
        out_d[steps, :] = d
        if T <= t_min + tol:
            out_s[steps] = np.inf
            steps += 1
            done = True
            break
        lf = latest_finish(topo, succ_ptr, succ_idx, d, T)
        m = 0
        for i in range(n):
            if lf[i] - (es[i] + d[i]) <= tol:
                local[i] = m
                m += 1
            else:
                local[i] = -1
        ntight = 0
        for e in range(ne_all):
            s_, t_ = src[e], dst[e]
            if local[s_] >= 0 and local[t_] >= 0 and es[s_] + d[s_] >= es[t_] - tol:
                ntight += 1
        nsrc = 0
        nsnk = 0
        for i in range(n):
            if local[i] >= 0:
                if es[i] <= tol:
                    nsrc += 1
                if es[i] + d[i] >= T - tol:
                    nsnk += 1
        narc = m + ntight + nsrc + nsnk
        tail = np.empty(narc, np.int64)
        head = np.empty(narc, np.int64)
        alo = np.zeros(narc, np.int64)
        ahi = np.full(narc, inf, np.int64)
        s_node = 2 * m
        t_node = 2 * m + 1
        crit = np.empty(m, np.int64)
        aflow = np.zeros(narc, np.int64)
        arc_of = np.empty(narc, np.int64)  # DAG edge of each dependency arc
        j = 0
        for i in range(n):
            if local[i] >= 0:
                crit[j] = i
                tail[j] = 2 * j
                head[j] = 2 * j + 1
                aflow[j] = node_flow[i]
                if np.isfinite(u[i]):
                    hv = np.ceil(u[i] * scale)
                    ahi[j] = inf if hv >= inf else np.int64(hv)
                lv = np.int64(np.floor(lo[i] * scale))
                alo[j] = lv if lv < ahi[j] else ahi[j]
                j += 1
        for e in range(ne_all):
            s_, t_ = src[e], dst[e]
            if local[s_] >= 0 and local[t_] >= 0 and es[s_] + d[s_] >= es[t_] - tol:
                tail[j] = 2 * local[s_] + 1
                head[j] = 2 * local[t_]
                aflow[j] = edge_flow[e]
                arc_of[j] = e
                j += 1
        for i in range(n):
            if local[i] >= 0 and es[i] <= tol:
                tail[j] = s_node
                head[j] = 2 * local[i]
                aflow[j] = src_flow[i]
                arc_of[j] = i
                j += 1
        for i in range(n):
            if local[i] >= 0 and es[i] + d[i] >= T - tol:
                tail[j] = 2 * local[i] + 1
                head[j] = t_node
                aflow[j] = snk_flow[i]
                arc_of[j] = i
                j += 1
        start = aflow.copy()
        status, side = min_cut_lower_bounds(
            2 * m + 2, tail, head, alo, ahi, s_node, t_node, inf, aflow
        )
        if status == 2:  # numerically infeasible lower bounds: no lengthening this step
            aflow[:] = start
            status, side = min_cut_lower_bounds(
                2 * m + 2, tail, head, np.zeros(narc, np.int64), ahi, s_node, t_node, inf, aflow
            )
        # keep this step's maximum flow for the next one (zero off the critical network)
        node_flow[:] = 0
        edge_flow[:] = 0
        src_flow[:] = 0
        snk_flow[:] = 0
        if status == 0:
            for jj in range(m):
                node_flow[crit[jj]] = aflow[jj]
            for jj in range(m, m + ntight):
                edge_flow[arc_of[jj]] = aflow[jj]
            for jj in range(m + ntight, m + ntight + nsrc):
                src_flow[arc_of[jj]] = aflow[jj]
            for jj in range(m + ntight + nsrc, narc):
                snk_flow[arc_of[jj]] = aflow[jj]
        if status == 1:
            out_s[steps] = np.inf
            steps += 1
            done = True
            break
        value = 0.0
        delta = np.inf
        for i in range(n):
            a[i] = 0.0
        for jj in range(m):
            i = crit[jj]
            if side[2 * jj] and not side[2 * jj + 1]:  # shortened
                a[i] = 1.0
                value += u[i]
                nxt = tau[i, kv[i] - 1] if on[i] else tau[i, kv[i]]
                if d[i] - nxt < delta:
                    delta = d[i] - nxt
            elif not side[2 * jj] and side[2 * jj + 1]:  # lengthened
                a[i] = -1.0
                value -= lo[i]
                nxt = tau[i, min(kv[i] + 1, nv[i] - 1)]
                if nxt - d[i] < delta:
                    delta = nxt - d[i]
        out_s[steps] = value
        steps += 1
        if not (delta > 0 and np.isfinite(delta)):
            done = True  # degenerate: nothing can move; stop here
            break
        # Shrink delta until no other path exceeds the new iteration time (Newton on the convex
        # longest-path function of the step).
        trial = np.empty(n)
        for _ in range(10_000):
            for i in range(n):
                trial[i] = d[i] - a[i] * delta
            ef2, ka = earliest_start_k(topo, pred_ptr, pred_idx, trial, a, tol)
            jmax = 0
            for i in range(n):
                if ef2[i] > ef2[jmax]:
                    jmax = i
            excess = ef2[jmax] - (T - delta)
            if excess <= tol:
                break
            sl = 1.0 - ka[jmax]
            if sl <= 0:
                break
            delta -= excess / sl
        for i in range(n):
            v = d[i] - a[i] * delta
            d[i] = min(max(v, shortest[i]), longest[i])
    return out_t[:steps], out_g[:steps], out_s[:steps], out_d[:steps], d, done


@njit(cache=True, nogil=True)
def iteration_times(topo, pred_ptr, pred_idx, durations):
    """Longest path (iteration time) for each row of ``durations`` ``(k, n)``."""
    k = durations.shape[0]
    out = np.empty(k)
    for r in range(k):
        d = durations[r]
        out[r] = (earliest_start(topo, pred_ptr, pred_idx, d) + d).max()
    return out


@njit(cache=True, nogil=True)
def _exchange(dag, ts, cs, nopt, deadline, max_passes, pick):
    """Local search on a plan within ``deadline`` (``pick`` in place).

    An exchange speeds one node ``a`` up by one option, then hands the float that frees to the
    other nodes' moves that save most, one at a time (``a`` itself may not slow back down); it
    is kept when it saves energy overall and undone otherwise. Passes over all nodes until one
    keeps nothing. A node is only tried when some other node lacks no more float for its next
    option than ``a`` would free. Every move fits in the float of the plan at that moment, so
    the plan still ends by ``deadline``.
    """
    topo, pred_ptr, pred_idx, succ_ptr, succ_idx = dag
    n = pick.shape[0]
    cur = np.empty(n)
    for v in range(n):
        cur[v] = ts[v, pick[v]]
    eps = 1e-12 * deadline
    es = np.empty(n)
    lf = np.empty(n)
    undo_node = np.empty(n + 1, np.int64)
    undo_pick = np.empty(n + 1, np.int64)
    stale = True
    for _ in range(max_passes):
        improved = False
        for a in range(n):
            if stale:
                _earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
                _latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
                # the two smallest amounts of float a node lacks to move to its next option,
                # and who lacks the smallest
                lo1 = np.inf
                lo2 = np.inf
                who = -1
                for v in range(n):
                    if pick[v] + 1 >= nopt[v]:
                        continue
                    lack = ts[v, pick[v] + 1] - (lf[v] - es[v])
                    if lack < lo1:
                        lo2 = lo1
                        lo1 = lack
                        who = v
                    elif lack < lo2:
                        lo2 = lack
                stale = False
            pa = pick[a]
            if pa == 0 or (lo2 if who == a else lo1) > ts[a, pa] - ts[a, pa - 1] + eps:
                continue
            nu = 0
            undo_node[nu] = a
            undo_pick[nu] = pa
            nu += 1
            pick[a] = pa - 1
            cur[a] = ts[a, pa - 1]
            gain = cs[a, pa] - cs[a, pa - 1]
            while nu < undo_node.shape[0]:
                _earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
                _latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
                bb = -1
                bj = -1
                bs = 0.0
                for b in range(n):
                    if b == a:
                        continue
                    p = pick[b]
                    room = lf[b] - es[b] + eps
                    for j in range(p + 1, nopt[b]):
                        if ts[b, j] > room:
                            break
                        sv = cs[b, p] - cs[b, j]
                        if sv > bs:
                            bs = sv
                            bb = b
                            bj = j
                if bb < 0:
                    break
                undo_node[nu] = bb
                undo_pick[nu] = pick[bb]
                nu += 1
                pick[bb] = bj
                cur[bb] = ts[bb, bj]
                gain += bs
            if gain > 1e-12 * (abs(cs[a, 0]) + 1.0):
                improved = True
                stale = True  # the plan changed: so did every node's float
            else:
                for k in range(nu - 1, -1, -1):
                    v = undo_node[k]
                    pick[v] = undo_pick[k]
                    cur[v] = ts[v, pick[v]]
        if not improved:
            break


@njit(cache=True, nogil=True)
def _repair(dag, ts, cs, deadline, forced, pick, cur, es):
    """Speed nodes of a plan that overruns ``deadline`` up until it fits (``pick``/``cur`` in
    place; ``es`` is scratch space); nodes with ``forced`` set stay as they are. Each step
    follows one longest path back from its end and, on it, makes the speed-up that costs least
    per second saved, among each node's faster options up to the first that covers the
    overrun (options between hull vertices lie above the hull: the next faster one alone can
    look cheap and then leave a costly jump for the rest). Returns whether the plan fits."""
    topo, pred_ptr, pred_idx = dag[0], dag[1], dag[2]
    n = pick.shape[0]
    eps = 1e-12 * deadline
    while True:
        _earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
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
    """Position of node ``v``'s next hull vertex slower than position ``p`` (``p`` itself at
    the slowest)."""
    j = p + 1
    while j < nopt[v] - 1 and not hull[v, j]:
        j += 1
    return min(j, nopt[v] - 1)


@njit(cache=True, nogil=True)
def _slower(hull, nopt, v, p, vertex, k):
    """Node ``v`` slowed from position ``p``: to its next slower hull vertex, or by ``k``
    options (both stop at the slowest)."""
    if vertex:
        return _next_vertex(hull, nopt, v, p)
    return min(p + k, nopt[v] - 1)


@njit(cache=True, nogil=True)
def _search(dag, ts, cs, nopt, hull, rank_ptr, diag, deadline, iters, top, pick):
    """Large-neighbourhood search on a plan within ``deadline`` (``pick`` in place; the caller
    seeds numba's generator). Each of ``iters`` trials perturbs a copy of the plan, reclaims its
    slack (:func:`_reclaim`, with a random price schedule) and keeps it when its energy is lower.
    Half the trials slow instructions down and repair the overrun by speeding up others
    (:func:`_repair`): 1-4 consecutive instructions of one rank by 1-5 options each; every
    instruction, or every other one, of a run of up to 8 on one rank to its next slower hull
    vertex (``hull``: flags in the sorted options); a band across the pipeline (on each of
    a random run of ranks, the instruction running at one random moment); or a diagonal (the
    same pass of 1-2 microbatches on a run of consecutive stages, as it travels through the
    pipeline: ``diag[stage, kind, microbatch]`` is its node, -1 for none). Bands and diagonals
    move each instruction by the same 1-5 options or to its next slower hull vertex. A
    diagonal slows one microbatch's pass as a whole: on A40 8x96 at 1.01 T0 the search
    reached 0.64 % above the bound in 8,000 trials with diagonals, 0.70 % without. The jumps
    to hull vertices cross options that lie above the hull's chord, which no step of a few
    options would be kept for: on the A40 a last-stage forward's hull goes from 1740 MHz
    straight to 1320. The rest of the trials speed instructions up by 1-3 options, freeing
    time to hand out afresh: those running in a random window of up to 5 % of the deadline, a
    run on one rank, or a scattered few. ``rank_ptr`` delimits each rank's instructions
    (numbered rank by rank, in execution order). Returns the plan's total effective cost."""
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
                _earliest_start_into(dag[0], dag[1], dag[2], cur, es)
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
            ok = _repair(dag, ts, cs, deadline, forced, cand, cur, es)
            forced[:] = False
            if not ok:
                continue
        elif u < 0.625:
            # speed up a band across the pipeline
            for v in range(n):
                cur[v] = ts[v, cand[v]]
            _earliest_start_into(dag[0], dag[1], dag[2], cur, es)
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
        _reclaim(dag, ts, cs, nopt, deadline, levels, decay, True, 8, top, free, cand)
        c = _plan_cost(cs, cand)
        if c < best - 1e-12 * abs(best):
            best = c
            pick[:] = cand
    return best


@njit(cache=True, nogil=True)
def search_plans(
    dag, ts, cs, nopt, hull, rank_ptr, diag, picks, deadlines, iters, seeds, levels, decay
):
    """Rows of ``picks`` (plans as positions in the sorted options) each given the slack up to
    its deadline (:func:`_reclaim`) and then improved by :func:`_search` (``iters`` trials,
    numba's generator seeded with ``seeds[r]`` for row ``r``, so results do not depend on how
    rows are split over threads)."""
    out = picks.copy()
    top = _top_rate(ts, cs, nopt)
    free = np.full(out.shape[1], np.inf)
    for r in range(out.shape[0]):
        _reclaim(dag, ts, cs, nopt, deadlines[r], levels, decay, True, 8, top, free, out[r])
        np.random.seed(seeds[r])
        _search(dag, ts, cs, nopt, hull, rank_ptr, diag, deadlines[r], iters, top, out[r])
    return out
