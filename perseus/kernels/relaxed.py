"""The relaxed time-cost trade-off: exact steps of the Phillips-Dessouky min-cut iteration.

Problem. Every node ``i`` has a convex, decreasing, piecewise-linear cost ``c_i(d)`` of its
duration ``d`` (the lower convex hull of its measured options in (time, effective cost); vertex
durations ``tau[i, :nv[i]]``, costs ``cost``, segment slopes ``slope``). For each iteration time
``T``, minimise ``G(T) = sum_i c_i(d_i)`` subject to the longest path being at most ``T``. ``G`` is
convex and piecewise linear; :func:`relaxed_chunk` walks its breakpoints from the longest
durations (the slowest ``T``) towards the shortest.

Method. At the current durations, the critical nodes (zero float) and the tight edges between
them form a network: each critical node becomes an arc whose capacity is its marginal cost of
shortening and whose lower bound is its marginal saving of lengthening back. A minimum cut of it
(:func:`perseus.kernels.flow.min_cut_lower_bounds`, on capacities scaled to integers by
``scale``) shortens the nodes on its forward arcs and lengthens those on its backward arcs by
the same amount; the cut value is ``-dG/dT`` just below ``T``. Rather than a fixed time quantum,
each step moves by the exact distance to the next event: a moved node reaching a hull vertex, or
a path off the critical network becoming critical, found by a Newton iteration on the longest
path, which is convex in the step (:func:`perseus.kernels.longest_paths.earliest_start_k` gives
its slope). Each step's maximum flow warm-starts the next (``node_flow``, ``edge_flow``,
``src_flow``, ``snk_flow``), since between breakpoints only a few bounds change.

The network is not built anew each step: one residual graph of the whole node-split DAG
(:func:`perseus.kernels.flow.split_graph`) is laid out once per sweep, and a step writes the
capacities of its critical network into it (arcs off the network get none) and augments the
last maximum flow, which stays feasible between breakpoints (the slopes only steepen as ``T``
falls). Where it does not fit (an arc carrying flow has left the network, or rounding moved a
bound past it), the step builds its network alone and repairs the flow through helper arcs
(:func:`perseus.kernels.flow.min_cut_lower_bounds`).

Within a chunk of steps, a step places on its hull only the nodes whose duration moved (the
others keep their vertex, rates and cost; ``G`` is still summed by node index), and takes its
earliest starts from the last step's Newton pass when the durations are that pass's own (no
clamp, no snap): the same numbers, bit for bit, as a step from scratch, with two of its
``O(n + m)`` passes gone. The maximum flow's searches stop at the sink's level.

Complexity: one step costs ``O(n + m)`` to find the critical network and write its capacities,
one warm-started maximum flow on ``2n + 2`` vertices, and ``O(n + m)`` per Newton iteration (one
per step, measured); the number of steps is the number of breakpoints of ``G``, not of time
quanta, and grows about linearly with ``n`` on pipelines (about 21 per node with a smooth
64-clock profile, 2.3 with the A100 profile), so a sweep is about ``O(n^2)``.

References: S. Phillips and M. I. Dessouky, "Solving the project time/cost tradeoff problem
using the minimal cut concept", Management Science 24(4) (1977), 393-400; D. R. Fulkerson, "A
network flow computation for project cost curves", Management Science 7(2) (1961), 167-178; its
use for pipeline training: J.-W. Chung et al., "Perseus: Reducing Energy Bloat in Large Model
Training", SOSP '24.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perseus.kernels.flow import dinic_into, min_cut_lower_bounds
from perseus.kernels.longest_paths import earliest_start_k_into

__all__ = ["relaxed_chunk"]


@njit(cache=True, nogil=True)
def relaxed_chunk(
    topo, pred_ptr, pred_idx, succ_ptr, succ_idx, src, dst,
    tau, cost, slope, nv, shortest, longest, d0, t_min, scale, inf, max_steps,
    node_flow, edge_flow, src_flow, snk_flow, kv, keep,
    g_ptr, g_to, g_frm, g_rev, node_pos, edge_pos, src_pos, snk_pos, g_cap, g_level,
):  # fmt: skip
    """Up to ``max_steps`` steps of the min-cut iteration along the relaxed frontier.

    The steps start from relaxed durations ``d0`` (see ``perseus.solver``).

    Returns ``(times, costs, slopes, kept, durations, d_next, done)``: per step the iteration
    time, the sum of relaxed effective costs, the cut value (``inf`` at the fastest point) and
    whether its durations were kept; the kept steps' durations (one row each, in order); the
    durations to continue from; whether the fastest point was reached.

    ``keep = (first, stride, t_top, cells_per_second, last_cell, last_time)`` says which steps'
    durations are kept (so that memory grows with what is kept, not with the number of steps):
    step ``first + j`` (its index since the sweep began) when it is a multiple of ``stride``,
    when its time falls in a new cell of a grid of ``cells_per_second`` cells per second counted
    down from ``t_top`` (``last_cell``: the cell of the last step kept that way; updated in
    place), and the fastest point. ``last_time`` (updated in place; ``inf`` before the first
    step) is the last time recorded: the times recorded never rise. A step whose move is below
    the time tolerance (a degenerate one: measured, a move of 2e-12 s on a 13 s iteration) can
    end with a longest path a rounding error (4e-14 s) longer than the step before it; it is
    recorded at the time before it. Its value is ``G`` at its own, slightly later, time, so
    at or below ``G`` at the earlier one (``G`` does not fall as ``T`` does): still a lower
    bound, and the breakpoints stay in order for every reader. ``kv`` holds each node's hull segment (updated in place, so that
    finding where a node sits costs ``O(1)`` amortised rather than ``O(H)``).

    ``node_flow`` / ``edge_flow`` / ``src_flow`` / ``snk_flow`` hold the maximum flow of the last
    step (per DAG node, DAG edge, source and sink arc) and are updated in place: each step's
    max-flow starts from the previous one, which is nearly maximum already.

    ``g_ptr`` ... ``snk_pos``: the residual graph of the DAG's node-split network
    (:func:`perseus.kernels.flow.split_graph`), on which every step's critical network is laid
    out by capacities alone; ``g_cap`` (one per arc) and ``g_level`` (``2 n + 2``) are work
    arrays.
    """
    n = d0.shape[0]
    d = d0.copy()
    out_t = np.empty(max_steps)
    out_g = np.empty(max_steps)
    out_s = np.empty(max_steps)
    out_d = np.empty((max_steps, n))
    out_k = np.zeros(max_steps, np.bool_)
    first = np.int64(keep[0])
    stride = np.int64(keep[1])
    t_top = keep[2]
    cells = keep[3]
    nkept = 0
    on = np.zeros(n, np.bool_)
    u = np.empty(n)
    lo = np.empty(n)
    a = np.zeros(n)
    local = np.empty(n, np.int64)
    side = np.zeros(2 * n, np.bool_)
    # work arrays, allocated once per chunk rather than once per pass
    moved = np.ones(n, np.bool_)  # whose duration changed since its hull position was found
    gterm = np.empty(n)
    es = np.empty(n)
    es_next = np.empty(n)
    es_next_ok = False
    lf = np.empty(n)
    trial = np.empty(n)
    ef2 = np.empty(n)
    ka = np.empty(n)
    lw = np.empty(n, np.int64)
    work = np.empty(3 * (2 * n + 2) + 1, np.int64)
    steps = 0
    done = False
    while steps < max_steps:
        # where every node that moved sits on its hull: vertex index, snapped duration, marginal
        # rates, cost (a node that did not move keeps them all)
        for i in range(n):
            if not moved[i]:
                continue
            moved[i] = False
            tolv = 1e-12 * max(1.0, abs(d[i]))
            # the last vertex at or below d[i]: d only moves by a segment or so between steps
            k = min(max(kv[i], 0), nv[i] - 1)
            while k > 0 and tau[i, k] > d[i] + tolv:
                k -= 1
            while k < nv[i] - 1 and tau[i, k + 1] <= d[i] + tolv:
                k += 1
            o = abs(d[i] - tau[i, k]) <= tolv
            if o and d[i] != tau[i, k]:
                d[i] = tau[i, k]
                es_next_ok = False
            kv[i] = k
            on[i] = o
            if k < nv[i] - 1:
                gterm[i] = cost[i, k] + slope[i, k] * (d[i] - tau[i, k])
            else:
                gterm[i] = cost[i, k]
            if o:
                u[i] = np.inf if k == 0 else -slope[i, k - 1]
            else:
                u[i] = -slope[i, k]
            lo[i] = 0.0 if (o and k == nv[i] - 1) else -slope[i, k]
        g = 0.0
        for i in range(n):  # by node index, as ever
            g += gterm[i]
        # the earliest starts (the last Newton pass's when the durations are its own) and the
        # iteration time
        T = 0.0
        if es_next_ok:
            es, es_next = es_next, es
            for i in range(n):
                if es[i] + d[i] > T:
                    T = es[i] + d[i]
        else:
            for v in topo:
                best = 0.0
                for q in range(pred_ptr[v], pred_ptr[v + 1]):
                    w = pred_idx[q]
                    f = es[w] + d[w]
                    if f > best:
                        best = f
                es[v] = best
                if best + d[v] > T:
                    T = best + d[v]
        tol = 1e-9 * max(T, 1e-9)
        recorded = min(T, keep[5]) if keep.shape[0] > 5 else T
        if keep.shape[0] > 5:
            keep[5] = recorded
        out_t[steps] = recorded
        out_g[steps] = g
        cell = np.floor((t_top - recorded) * cells)
        fastest = T <= t_min + tol
        if (first + steps) % stride == 0 or cell != keep[4] or fastest:
            if cell != keep[4]:
                keep[4] = cell
            out_k[steps] = True
            out_d[nkept, :] = d
            nkept += 1
        if fastest:
            out_s[steps] = np.inf
            steps += 1
            done = True
            break
        # latest finishes and the critical nodes, in one pass in reverse topological order
        for r in range(n - 1, -1, -1):
            v = topo[r]
            best = T
            for q in range(succ_ptr[v], succ_ptr[v + 1]):
                w = succ_idx[q]
                f = lf[w] - d[w]
                if f < best:
                    best = f
            lf[v] = best
            local[v] = 0 if best - (es[v] + d[v]) <= tol else -1
        status = _warm_cut(
            n, local, es, d, T, tol, u, lo, src, dst, scale, inf,
            node_flow, edge_flow, src_flow, snk_flow,
            g_ptr, g_to, g_frm, g_rev, node_pos, edge_pos, src_pos, snk_pos, g_cap, g_level,
            side, lw, work,
        )  # fmt: skip
        if status == 3:  # the last flow does not fit this network: build it and repair
            status = _rebuilt_cut(
                n, local, es, d, T, tol, u, lo, src, dst, scale, inf,
                node_flow, edge_flow, src_flow, snk_flow, side,
            )  # fmt: skip
        if status == 1:
            out_s[steps] = np.inf
            steps += 1
            done = True
            break
        value = 0.0
        delta = np.inf
        for i in range(n):
            a[i] = 0.0
            if local[i] < 0:
                continue
            if side[2 * i] and not side[2 * i + 1]:  # shortened
                a[i] = 1.0
                value += u[i]
                nxt = tau[i, kv[i] - 1] if on[i] else tau[i, kv[i]]
                if d[i] - nxt < delta:
                    delta = d[i] - nxt
            elif not side[2 * i] and side[2 * i + 1]:  # lengthened
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
        es_next_ok = False
        for _ in range(10_000):
            for i in range(n):
                trial[i] = d[i] - a[i] * delta
            earliest_start_k_into(topo, pred_ptr, pred_idx, trial, a, tol, ef2, ka, es_next)
            jmax = 0
            for i in range(n):
                if ef2[i] > ef2[jmax]:
                    jmax = i
            excess = ef2[jmax] - (T - delta)
            if excess <= tol:
                es_next_ok = True
                break
            sl = 1.0 - ka[jmax]
            if sl <= 0:
                es_next_ok = True
                break
            delta -= excess / sl
        for i in range(n):
            x = d[i] - a[i] * delta
            y = min(max(x, shortest[i]), longest[i])
            if y != x:
                es_next_ok = False  # clamped: not the durations the last pass had
            if y != d[i]:
                moved[i] = True
                d[i] = y
    return out_t[:steps], out_g[:steps], out_s[:steps], out_k[:steps], out_d[:nkept], d, done


@njit(cache=True, nogil=True)
def _node_bounds(u, lo, scale, inf):
    """A critical node's arc bounds in flow units: ``(lower, upper)``."""
    hi = inf
    if np.isfinite(u):
        hv = np.ceil(u * scale)
        hi = inf if hv >= inf else np.int64(hv)
    lw = np.int64(np.floor(lo * scale))
    return (lw if lw < hi else hi), hi


@njit(cache=True, nogil=True)
def _warm_cut(
    n, local, es, d, T, tol, u, lo, src, dst, scale, inf,
    node_flow, edge_flow, src_flow, snk_flow,
    g_ptr, g_to, g_frm, g_rev, node_pos, edge_pos, src_pos, snk_pos, g_cap, g_level, side, lw,
    work,
):  # fmt: skip
    """The minimum cut of this step's critical network, by maximum flow from the last step's flow.

    The critical network is the nodes with ``local >= 0``, on the persistent node-split graph of
    :func:`perseus.kernels.flow.split_graph`. Every arc off the network gets no capacity.
    Returns 0 (``side``: the source side, per split vertex; flows updated), 1 (every cut is
    infinite) or 3: the last flow does not fit this network's bounds (or the network needs an
    arc the layout lacks), and nothing was computed. Between breakpoints the last maximum flow
    stays feasible (slopes only steepen as ``T`` falls), so 3 is rare.
    """
    fits = True
    for i in range(n):
        p = node_pos[i]
        if local[i] >= 0:
            low, hi = _node_bounds(u[i], lo[i], scale, inf)
            lw[i] = low
            f = node_flow[i]
            if f < low or f > hi:
                fits = False
            g_cap[p] = inf if hi >= inf else hi - f
            g_cap[g_rev[p]] = f - low
        else:
            if node_flow[i] != 0:
                fits = False
            g_cap[p] = 0
            g_cap[g_rev[p]] = 0
        q = src_pos[i]
        on = local[i] >= 0 and es[i] <= tol
        if q < 0:
            if on or src_flow[i] != 0:
                fits = False
        elif on:
            g_cap[q] = inf
            g_cap[g_rev[q]] = src_flow[i]
        else:
            if src_flow[i] != 0:
                fits = False
            g_cap[q] = 0
            g_cap[g_rev[q]] = 0
        q = snk_pos[i]
        on = local[i] >= 0 and es[i] + d[i] >= T - tol
        if q < 0:
            if on or snk_flow[i] != 0:
                fits = False
        elif on:
            g_cap[q] = inf
            g_cap[g_rev[q]] = snk_flow[i]
        else:
            if snk_flow[i] != 0:
                fits = False
            g_cap[q] = 0
            g_cap[g_rev[q]] = 0
    for e in range(src.shape[0]):
        p = edge_pos[e]
        s_, t_ = src[e], dst[e]
        if local[s_] >= 0 and local[t_] >= 0 and es[s_] + d[s_] >= es[t_] - tol:
            g_cap[p] = inf
            g_cap[g_rev[p]] = edge_flow[e]
        else:
            if edge_flow[e] != 0:
                fits = False
            g_cap[p] = 0
            g_cap[g_rev[p]] = 0
    if not fits:
        return 3
    nn = 2 * n + 2
    f = dinic_into(nn, g_ptr, g_to, g_cap, g_rev, g_frm, 2 * n, 2 * n + 1, inf, g_level, work)
    if f >= inf:
        return 1
    for i in range(n):
        if local[i] >= 0:
            node_flow[i] = lw[i] + g_cap[g_rev[node_pos[i]]]
        q = src_pos[i]
        src_flow[i] = g_cap[g_rev[q]] if q >= 0 else 0
        q = snk_pos[i]
        snk_flow[i] = g_cap[g_rev[q]] if q >= 0 else 0
        side[2 * i] = g_level[2 * i] >= 0
        side[2 * i + 1] = g_level[2 * i + 1] >= 0
    for e in range(src.shape[0]):
        edge_flow[e] = g_cap[g_rev[edge_pos[e]]]
    return 0


@njit(cache=True, nogil=True)
def _rebuilt_cut(
    n, local, es, d, T, tol, u, lo, src, dst, scale, inf,
    node_flow, edge_flow, src_flow, snk_flow, side,
):  # fmt: skip
    """:func:`_warm_cut` on a network built for this step alone, the last flow clamped into it.

    The clamped flow is repaired (:func:`perseus.kernels.flow.min_cut_lower_bounds`). A start
    the bounds cannot take (its value more than the network carries, which integer rounding of
    the bounds can cause) is dropped for a cold solve, from a zero flow, which any feasible flow
    repairs; only bounds that admit no flow at all are dropped (no lengthening this step).
    Returns 0, 1 as :func:`_warm_cut`, or 2 (nothing can move: the sweep stops).
    """
    m = 0
    for i in range(n):
        if local[i] >= 0:
            local[i] = m
            m += 1
    ne_all = src.shape[0]
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
            alo[j], ahi[j] = _node_bounds(u[i], lo[i], scale, inf)
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
    status, cut = min_cut_lower_bounds(2 * m + 2, tail, head, alo, ahi, s_node, t_node, inf, aflow)
    if status == 2:  # the last flow is more than this network carries (rounding): start cold
        aflow[:] = 0
        status, cut = min_cut_lower_bounds(
            2 * m + 2, tail, head, alo, ahi, s_node, t_node, inf, aflow
        )
    if status == 2:  # numerically infeasible lower bounds: no lengthening this step
        aflow[:] = 0
        status, cut = min_cut_lower_bounds(
            2 * m + 2, tail, head, np.zeros(narc, np.int64), ahi, s_node, t_node, inf, aflow
        )
    # keep this step's maximum flow for the next one (zero off the critical network)
    node_flow[:] = 0
    edge_flow[:] = 0
    src_flow[:] = 0
    snk_flow[:] = 0
    for v in range(2 * n):
        side[v] = False
    if status == 0:
        for jj in range(m):
            node_flow[crit[jj]] = aflow[jj]
        for jj in range(m, m + ntight):
            edge_flow[arc_of[jj]] = aflow[jj]
        for jj in range(m + ntight, m + ntight + nsrc):
            src_flow[arc_of[jj]] = aflow[jj]
        for jj in range(m + ntight + nsrc, narc):
            snk_flow[arc_of[jj]] = aflow[jj]
        for jj in range(m):
            side[2 * crit[jj]] = cut[2 * jj]
            side[2 * crit[jj] + 1] = cut[2 * jj + 1]
    return status
