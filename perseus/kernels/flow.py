"""Maximum flow (Dinic) and the minimum cut of a network whose arcs have lower bounds.

Problem. A directed network on ``nn`` vertices whose arc ``i`` (``tail[i] -> head[i]``) must carry
a flow in ``[lo[i], hi[i]]`` (integers; ``hi == inf`` is unbounded). Find a maximum ``s``-``t``
flow and a minimum cut, where the value of a cut ``(S, V - S)`` is the sum of ``hi`` over its
forward arcs minus the sum of ``lo`` over its backward arcs (max-flow = min-cut holds in that
form). This is what one step of the Phillips-Dessouky time-cost trade-off asks for
(:mod:`perseus.kernels.relaxed`): forward arcs are nodes that can be shortened, at their marginal
cost; lower bounds are the marginal savings of lengthening a node back.

Method. :func:`min_cut_lower_bounds` clamps a starting flow (the previous step's, so that little
is left to augment) into the bounds, routes each vertex's imbalance through a helper source and
sink (with a return arc ``t -> s``), and runs :func:`dinic` from the helper source: if it cannot
saturate the helpers, the bounds admit no feasible flow. Otherwise the helpers are dropped and
:func:`dinic` augments from ``s`` to ``t``; the source side of the final residual graph is a
minimum cut. This is the standard reduction of flows with lower bounds to plain maximum flow.

:func:`split_graph` lays out, once, the residual graph of every network a relaxed sweep can ask
for on one DAG (each node an arc from its "in" to its "out" vertex, each DAG edge an arc, a
source arc into every node without predecessors and a sink arc out of every node without
successors), so that a step only rewrites capacities and runs :func:`dinic` on it from the last
step's flow, instead of building a network and its residual graph anew.

Complexity: :func:`dinic` is ``O(V^2 E)`` (at most ``V - 1`` phases, each a BFS and a blocking
flow found by depth-first advance-and-retreat in ``O(V E)``); capacities are integers, so
augmentation is exact. :func:`min_cut_lower_bounds` adds ``O(V + E)`` to build the residual
graph (arcs grouped by tail with a counting sort) and to find the cut.

References: E. A. Dinic, "Algorithm for solution of a problem of maximum flow in a network with
power estimation", Soviet Mathematics Doklady 11 (1970), 1277-1280; flows with lower bounds:
R. K. Ahuja, T. L. Magnanti and J. B. Orlin, *Network Flows* (Prentice Hall, 1993), ch. 6.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dinic", "dinic_into", "min_cut_lower_bounds", "split_graph"]


@njit(cache=True, nogil=True)
def dinic(nn, ptr, to, cap, rev, frm, s, t, limit, level):
    """Dinic's max-flow from ``s`` to ``t`` on a residual graph of ``nn`` vertices.

    Arcs are grouped by tail: vertex ``u``'s are ``ptr[u]:ptr[u + 1]``; arc ``a`` runs from
    ``frm[a]`` to ``to[a]`` with residual capacity ``cap[a]``, and ``rev[a]`` is its reverse.
    ``cap`` is updated in place (so the residual graph of the result is left behind); returns
    the flow value pushed, stopping at ``limit``. ``level`` (``nn`` integers, overwritten):
    when the flow stopped below ``limit``, ``level[v] >= 0`` exactly for the vertices the last
    residual graph reaches from ``s`` (the source side of a minimum cut).
    """
    work = np.empty(3 * nn + 1, np.int64)
    return dinic_into(nn, ptr, to, cap, rev, frm, s, t, limit, level, work)


@njit(cache=True, nogil=True)
def dinic_into(nn, ptr, to, cap, rev, frm, s, t, limit, level, work):
    """:func:`dinic` with its work array given (``3 nn + 1`` integers): no allocation.

    A sweep calls it once per step, on a graph of ``2 n + 2`` vertices. A phase's search stops
    at ``t``'s level (the blocking flow only follows arcs one level up, so the vertices past it
    would be dead ends): the same flow, found with less work. The last search, which does not
    reach ``t``, labels everything reachable.
    """
    it = work[:nn]
    queue = work[nn : 2 * nn]
    path = work[2 * nn :]
    flow = 0
    while flow < limit:
        level[:] = -1
        level[s] = 0
        it[s] = ptr[s]
        qh = 0
        qt = 1
        queue[0] = s
        while qh < qt:
            u = queue[qh]
            qh += 1
            if level[t] >= 0 and level[u] >= level[t]:
                break  # no shortest path to t goes further: the levels past t's stay unset
            for a in range(ptr[u], ptr[u + 1]):
                v = to[a]
                if cap[a] > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    it[v] = ptr[v]  # the advance below only visits vertices given a level
                    queue[qt] = v
                    qt += 1
        if level[t] < 0:
            break
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
def _by_tail(nn, atail, ahead, narcs):
    """Arcs and their reverses laid out grouped by tail (a counting sort, ``O(nn + narcs)``).

    The arcs are ``0..narcs-1`` and their reverses ``narcs..2*narcs-1`` (``atail``/``ahead``).
    Returns ``ptr`` (arcs of ``u`` at ``ptr[u]..ptr[u+1]-1``), ``pos_of`` (arc ``j``'s
    position), and per position ``to``, ``frm`` and ``rev`` (the position of its reverse).
    """
    ptr = np.zeros(nn + 1, np.int64)
    for j in range(2 * narcs):
        ptr[atail[j] + 1] += 1
    for u in range(nn):
        ptr[u + 1] += ptr[u]
    fill = ptr[:-1].copy()
    pos_of = np.empty(2 * narcs, np.int64)
    for j in range(2 * narcs):
        pos_of[j] = fill[atail[j]]
        fill[atail[j]] += 1
    to = np.empty(2 * narcs, np.int64)
    frm = np.empty(2 * narcs, np.int64)
    rev = np.empty(2 * narcs, np.int64)
    for j in range(2 * narcs):
        q = pos_of[j]
        to[q] = ahead[j]
        frm[q] = atail[j]
        rev[q] = pos_of[j + narcs] if j < narcs else pos_of[j - narcs]
    return ptr, pos_of, to, frm, rev


@njit(cache=True, nogil=True)
def min_cut_lower_bounds(nn, tail, head, lo, hi, s, t, inf, flow):
    """Minimum ``s``-``t`` cut of a network whose arcs carry flow in ``[lo, hi]``.

    The bounds are integers; ``hi == inf`` is unbounded. The value of a cut is ``sum(hi of
    forward arcs) - sum(lo of backward arcs)``.

    ``flow`` is a starting flow per arc (clamped into ``[lo, hi]``; it need not conserve flow):
    warm-starting from the previous step's flow leaves little to augment. It is overwritten with
    a maximum flow. The repair never lowers the flow's value below the start's net inflow into
    ``t`` (the imbalance at ``t`` is sent back to ``s`` along the return arc, which is not
    undone), so a start is only repaired when the bounds admit a flow at least that large;
    from a zero start, every feasible flow of value ``>= 0`` qualifies. Finite capacities must
    sum to far less than ``inf``.

    Returns ``(status, side)``: status 0 = found (``side[v]`` is True on the source side),
    1 = every cut is infinite (``t`` is reachable from ``s`` along unbounded arcs), 2 = the
    lower bounds admit no flow the start can be repaired into (see above). In the time-cost
    trade-off the slope only grows as ``T`` falls, so the previous step's flow fits; where
    integer rounding says otherwise, the caller retries without lower bounds.
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
    ptr, pos_of, to, frm, rev = _by_tail(total_nodes, atail, ahead, narcs)
    cap = np.empty(2 * narcs, np.int64)
    for j in range(2 * narcs):
        cap[pos_of[j]] = acap[j]
    if need > 0:
        level = np.empty(total_nodes, np.int64)
        f = dinic(total_nodes, ptr, to, cap, rev, frm, ss, tt, need, level)
        if f < need:
            return 2, np.zeros(nn, np.bool_)
    # drop the helper arcs and the return arc (both directions)
    for j in range(2 * narcs):
        if frm[j] >= nn or to[j] >= nn:
            cap[j] = 0
    rpos = pos_of[ret]
    cap[rpos] = 0
    cap[rev[rpos]] = 0
    level = np.empty(total_nodes, np.int64)
    f = dinic(total_nodes, ptr, to, cap, rev, frm, s, t, inf, level)
    # an unbounded arc's residual may have lost up to ``need`` to the repair: any flow that
    # large ran along a path of unbounded arcs (finite capacities sum to far less)
    if f >= inf - need:
        return 1, np.zeros(nn, np.bool_)
    for i in range(m):  # the flow on arc i is lo + its reverse residual
        flow[i] = lo[i] + cap[pos_of[narcs + i]]
    # the source side: what the last phase's search reached (the helpers are cut off)
    side = np.zeros(nn, np.bool_)
    for v in range(nn):
        side[v] = level[v] >= 0
    return 0, side


@njit(cache=True, nogil=True)
def split_graph(n, src, dst, has_pred, has_succ):
    """The residual graph of the node-split network of a DAG, grouped by tail.

    The grouping is as :func:`dinic` reads it.

    The DAG has ``n`` nodes and edges ``src[e] -> dst[e]``.

    Vertices: ``2 i`` and ``2 i + 1`` (node ``i``'s in and out), the source ``2 n`` and the sink
    ``2 n + 1``. Arcs: node ``i`` (``2 i -> 2 i + 1``), edge ``e`` (``2 src + 1 -> 2 dst``), a
    source arc into every node with ``has_pred`` false and a sink arc out of every node with
    ``has_succ`` false, each with its reverse. Returns ``(ptr, to, frm, rev, node_pos,
    edge_pos, src_pos, snk_pos)``: the graph (as :func:`dinic` takes it) and the position of
    each forward arc (``-1`` where a node has no source or sink arc); its reverse is at
    ``rev[pos]``. Capacities are the caller's (one ``int64`` per position). ``O(n + m)``.
    """
    ne = src.shape[0]
    nsrc = 0
    nsnk = 0
    for i in range(n):
        if not has_pred[i]:
            nsrc += 1
        if not has_succ[i]:
            nsnk += 1
    narcs = n + ne + nsrc + nsnk
    atail = np.empty(2 * narcs, np.int64)
    ahead = np.empty(2 * narcs, np.int64)
    kind_pos = np.full(3 * n + ne, -1, np.int64)  # forward arc index of each node/edge/src/snk
    k = 0
    for i in range(n):
        atail[k] = 2 * i
        ahead[k] = 2 * i + 1
        kind_pos[i] = k
        k += 1
    for e in range(ne):
        atail[k] = 2 * src[e] + 1
        ahead[k] = 2 * dst[e]
        kind_pos[n + e] = k
        k += 1
    for i in range(n):
        if not has_pred[i]:
            atail[k] = 2 * n
            ahead[k] = 2 * i
            kind_pos[n + ne + i] = k
            k += 1
    for i in range(n):
        if not has_succ[i]:
            atail[k] = 2 * i + 1
            ahead[k] = 2 * n + 1
            kind_pos[2 * n + ne + i] = k
            k += 1
    for j in range(narcs):
        atail[narcs + j] = ahead[j]
        ahead[narcs + j] = atail[j]
    nn = 2 * n + 2
    ptr, pos_of, to, frm, rev = _by_tail(nn, atail, ahead, narcs)
    pos = np.full(3 * n + ne, -1, np.int64)
    for x in range(3 * n + ne):
        if kind_pos[x] >= 0:
            pos[x] = pos_of[kind_pos[x]]
    node_pos = pos[:n].copy()
    edge_pos = pos[n : n + ne].copy()
    src_pos = pos[n + ne : 2 * n + ne].copy()
    snk_pos = pos[2 * n + ne :].copy()
    return ptr, to, frm, rev, node_pos, edge_pos, src_pos, snk_pos
