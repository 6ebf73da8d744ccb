"""Minimum-cost circulation by the primal network simplex method, warm-startable.

Problem. A directed network on ``nn`` vertices whose arc ``i`` (``src[i] -> dst[i]``) has an
integer capacity ``cap[i] > 0`` and an integer cost ``cost[i]``: find a circulation (flow
conserved at every vertex, ``0 <= flow <= cap``) of least total cost, with vertex potentials
``pi`` proving it (reduced costs ``cost[i] - pi[src[i]] + pi[dst[i]]`` non-negative on arcs that
could carry more flow, non-positive on arcs that could carry less). The relaxation
(:mod:`perseus.solver.sandwich`) asks for one per deadline: only one arc's cost (the return
arc's, the deadline) changes from one to the next.

Method. The primal network simplex on a strongly feasible spanning tree, as networkx's
``network_simplex`` (itself after Kiraly and Kovacs) lays it out: an artificial root joined to
every vertex by an arc of prohibitive cost gives the first tree (every flow zero); entering arcs
are chosen by block search (blocks of ``sqrt(E)`` arcs, the most negative reduced cost of the
first block that has one), the leaving arc is the last blocking arc of the cycle (which keeps
the tree strongly feasible, so degenerate pivots cannot cycle); the tree is kept as parent
pointers, subtree sizes and a depth-first thread, so that re-rooting a subtree and updating its
potentials cost its size. **Warm start**: the tree, the flows and the block position are kept in
the state arrays between calls; changing costs keeps the tree primal feasible (and strongly
feasible), so :func:`reprice` recomputes the potentials in ``O(V)`` and the next
:func:`simplex` call resumes pivoting from there.

Complexity: each pivot costs ``O(B)`` to price a block plus the cycle's length and the moved
subtree's size (``O(V)`` in the worst case); the number of pivots is not polynomially bounded in
the worst case, but a warm start from a nearby deadline needs few non-degenerate ones.

References: R. K. Ahuja, T. L. Magnanti and J. B. Orlin, *Network Flows* (Prentice Hall, 1993),
ch. 11; W. H. Cunningham, "A network simplex method", Mathematical Programming 11 (1976)
(strongly feasible trees); Z. Kiraly and P. Kovacs, "Efficient implementations of minimum-cost
flow algorithms", Acta Universitatis Sapientiae, Informatica 4(1) (2012); networkx's
``network_simplex`` (the layout of the tree and of the pivot).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["init_tree", "reprice", "simplex"]


@njit(cache=True, nogil=True)
def init_tree(nn, big):
    """The first strongly feasible tree of an ``nn``-vertex circulation.

    Vertex ``nn`` is the root, vertex ``v``'s parent arc is artificial arc ``v`` (``v -> root``,
    cost ``big``). Returns ``(parent, pedge, size, nxt, prv, last, pi)``; artificial arc ``v``
    is numbered ``E + v`` by the caller's arc arrays.
    """
    parent = np.full(nn + 1, -1, np.int64)
    pedge = np.full(nn + 1, -1, np.int64)
    size = np.ones(nn + 1, np.int64)
    nxt = np.empty(nn + 1, np.int64)
    prv = np.empty(nn + 1, np.int64)
    last = np.empty(nn + 1, np.int64)
    pi = np.zeros(nn + 1, np.int64)
    for v in range(nn):
        parent[v] = nn
        pedge[v] = -1  # set by the caller: E + v
        nxt[v] = v + 1
        prv[v] = v - 1 if v > 0 else nn
        last[v] = v
        pi[v] = big
    nxt[nn - 1] = nn
    nxt[nn] = 0
    prv[nn] = nn - 1
    last[nn] = nn - 1
    size[nn] = nn + 1
    return parent, pedge, size, nxt, prv, last, pi


@njit(cache=True, nogil=True)
def reprice(src, dst, cost, parent, pedge, nxt, pi, root):
    """Recompute every potential from the tree, walking the thread from the root: ``O(V)``.

    Tree arcs' reduced costs are zero, and the root's potential is zero.
    """
    pi[root] = 0
    v = nxt[root]
    while v != root:
        i = pedge[v]
        p = parent[v]
        if dst[i] == v:
            pi[v] = pi[p] - cost[i]
        else:
            pi[v] = pi[p] + cost[i]
        v = nxt[v]


@njit(cache=True, nogil=True)
def _reduced(i, src, dst, cost, flow, pi):
    c = cost[i] - pi[src[i]] + pi[dst[i]]
    return c if flow[i] == 0 else -c


@njit(cache=True, nogil=True)
def simplex(src, dst, cap, cost, flow, parent, pedge, size, nxt, prv, last, pi, state, max_pivots):
    """Pivot until no arc prices out (optimal) or ``max_pivots`` pivots (all arrays in place).

    ``state``: ``[block start, pivots so far, degenerate pivots so far]``. Returns whether the
    circulation is optimal.
    """
    m = src.shape[0]
    root = parent.shape[0] - 1
    block = max(1, int(np.ceil(np.sqrt(m))))
    nblocks = (m + block - 1) // block
    wn = np.empty(root + 2, np.int64)
    we = np.empty(root + 2, np.int64)
    f = state[0]
    done = 0
    misses = 0
    while misses < nblocks:
        if done >= max_pivots:
            state[0] = f
            return False
        # price one block (wrapping around)
        best = -1
        best_c = 0
        for k in range(block):
            i = f + k
            if i >= m:
                i -= m
            c = _reduced(i, src, dst, cost, flow, pi)
            if c < best_c:
                best_c = c
                best = i
        f += block
        if f >= m:
            f -= m
        if best < 0:
            misses += 1
            continue
        misses = 0
        i = best
        if flow[i] == 0:
            p = src[i]
            q = dst[i]
        else:
            p = dst[i]
            q = src[i]
        # the cycle: apex w, w .. p, arc i, q .. w
        a = p
        b = q
        sa = size[a]
        sb = size[b]
        while True:
            while sa < sb:
                a = parent[a]
                sa = size[a]
            while sa > sb:
                b = parent[b]
                sb = size[b]
            if sa == sb:
                if a != b:
                    a = parent[a]
                    sa = size[a]
                    b = parent[b]
                    sb = size[b]
                else:
                    break
        w = a
        # nodes w .. p (reversed trace from p) and their edges
        np_ = 0
        v = p
        while v != w:
            np_ += 1
            v = parent[v]
        # fill wn[0..np_] = w..p, we[0..np_-1] = edges down from w to p
        v = p
        k = np_
        wn[k] = p
        while v != w:
            we[k - 1] = pedge[v]
            v = parent[v]
            k -= 1
            wn[k] = v
        ln = np_ + 1
        le = np_
        if not (le == 1 and we[0] == i):
            we[le] = i
            le += 1
        pos_i = le - 1
        v = q
        while v != w:
            wn[ln] = v
            ln += 1
            we[le] = pedge[v]
            le += 1
            v = parent[v]
        # leaving arc: the last of least residual capacity along the cycle
        j = -1
        s = -1
        pos_j = -1
        delta = np.int64(1) << 62
        for k in range(le - 1, -1, -1):
            e = we[k]
            u = wn[k]
            r = cap[e] - flow[e] if src[e] == u else flow[e]
            if r < delta:
                delta = r
                j = e
                s = u
                pos_j = k
        t = dst[j] if src[j] == s else src[j]
        if delta > 0:
            for k in range(le):
                e = we[k]
                if src[e] == wn[k]:
                    flow[e] += delta
                else:
                    flow[e] -= delta
        else:
            state[2] += 1
        done += 1
        state[1] += 1
        if i == j:
            continue
        if parent[t] != s:
            s, t = t, s
        if pos_i > pos_j:
            p, q = q, p
        # remove arc (s, t), parent[t] == s
        size_t = size[t]
        prev_t = prv[t]
        last_t = last[t]
        next_last_t = nxt[last_t]
        parent[t] = -1
        pedge[t] = -1
        nxt[prev_t] = next_last_t
        prv[next_last_t] = prev_t
        nxt[last_t] = t
        prv[t] = last_t
        x = s
        while x != -1:
            size[x] -= size_t
            if last[x] == last_t:
                last[x] = prev_t
            x = parent[x]
        # make q the root of its subtree
        na = 0
        x = q
        while x != -1:
            wn[na] = x
            na += 1
            x = parent[x]
        for k in range(na - 1, 0, -1):
            pp = wn[k]
            qq = wn[k - 1]
            size_p = size[pp]
            last_p = last[pp]
            prev_q = prv[qq]
            last_q = last[qq]
            next_last_q = nxt[last_q]
            parent[pp] = qq
            parent[qq] = -1
            pedge[pp] = pedge[qq]
            pedge[qq] = -1
            size[pp] = size_p - size[qq]
            size[qq] = size_p
            nxt[prev_q] = next_last_q
            prv[next_last_q] = prev_q
            nxt[last_q] = qq
            prv[qq] = last_q
            if last_p == last_q:
                last[pp] = prev_q
                last_p = prev_q
            prv[pp] = last_q
            nxt[last_q] = pp
            nxt[last_p] = qq
            prv[qq] = last_p
            last[qq] = last_p
        # add arc i = (p, q), q the root of its subtree
        last_p = last[p]
        next_last_p = nxt[last_p]
        size_q = size[q]
        last_q = last[q]
        parent[q] = p
        pedge[q] = i
        nxt[last_p] = q
        prv[q] = last_p
        prv[next_last_p] = last_q
        nxt[last_q] = next_last_p
        x = p
        while x != -1:
            size[x] += size_q
            if last[x] == last_p:
                last[x] = last_q
            x = parent[x]
        # potentials of q's subtree
        d = pi[p] - cost[i] - pi[q] if q == dst[i] else pi[p] + cost[i] - pi[q]
        x = q
        lq = last[q]
        pi[x] += d
        while x != lq:
            x = nxt[x]
            pi[x] += d
    state[0] = f
    return True
