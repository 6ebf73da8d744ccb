"""Exchanges: a local search that trades one node's speed-up for other nodes' slow-downs.

Problem. Given a plan within a deadline (positions ``pick`` in each node's options sorted by
time, as in :mod:`perseus.kernels.rounding`), lower its effective cost without passing the
deadline. Reclaiming slack alone stops at plans where no single node can slow down; an exchange
first speeds one node up to free float for others.

Method. :func:`exchange` speeds a node ``a`` up by one option, then hands the float that frees to
the other nodes' moves that save most, one at a time (``a`` may not slow back down); the exchange
is kept when it saves energy overall and undone otherwise. Passes over all nodes repeat until one
keeps nothing, up to ``max_passes``. A node is only tried when some other node lacks no more
float for its next option than ``a`` would free. Every move fits in the float of the plan at
that moment, so the plan still ends by the deadline.

Complexity: each move an exchange hands out costs a longest-path pass and a scan of the options,
``O(nK + m)`` for ``n`` nodes, ``m`` edges and at most ``K`` options a node; a pass tries up to
``n`` nodes, so a pass is ``O(n (nK + m))`` per move an exchange makes. Callers polish only a few
plans this way.

Reference: the project's own neighbourhood for the discrete time-cost trade-off (see
:mod:`perseus.kernels.rounding` for the problem and its hardness).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from perseus.kernels.longest_paths import earliest_start_into, latest_finish_into

__all__ = ["exchange"]


@njit(cache=True, nogil=True)
def exchange(dag, ts, cs, nopt, deadline, max_passes, pick):
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
                earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
                latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
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
                earliest_start_into(topo, pred_ptr, pred_idx, cur, es)
                latest_finish_into(topo, succ_ptr, succ_idx, cur, deadline, lf)
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
