"""Longest paths on the instruction DAG: earliest starts, latest finishes and iteration times.

Problem. An activity-on-node DAG (one node per instruction) with a duration ``d[v]`` per node. The
earliest start of ``v`` is the longest path into it, ``ES(v) = max(ES(u) + d[u])`` over its
predecessors ``u`` (0 for a source); the iteration time is ``max(ES(v) + d[v])``. For a deadline
``T``, the latest finish of ``v`` is ``LF(v) = min(LF(w) - d[w])`` over its successors ``w`` (``T``
for a sink). A node's *float* ``LF(v) - ES(v) - d[v]`` is how much longer it may run without
pushing the iteration past ``T``; nodes with zero float are critical.

The DAG arrives as flat arrays: ``topo`` (the nodes in a topological order) and the predecessor and
successor lists in CSR form (``pred_ptr``/``pred_idx``, ``succ_ptr``/``succ_idx``), as
:class:`perseus.dag.PipelineDAG` holds them. The ``*_into`` variants write into a caller's array,
so that loops which recompute floats after every move allocate nothing.

Complexity: ``O(n + m)`` per pass for ``n`` nodes and ``m`` edges; :func:`iteration_times` is one
pass per row.

Reference: the critical path method, J. E. Kelley and M. R. Walker, "Critical-path planning and
scheduling", Proc. Eastern Joint Computer Conference (1959), 160-173.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "earliest_start",
    "latest_finish",
    "earliest_start_into",
    "latest_finish_into",
    "ready_time",
    "earliest_start_k",
    "earliest_start_k_into",
    "iteration_times",
]


@njit(cache=True, nogil=True)
def earliest_start(topo, pred_ptr, pred_idx, d):
    """Earliest start of every node (longest path from any source) for durations ``d``."""
    es = np.empty(d.shape[0])
    earliest_start_into(topo, pred_ptr, pred_idx, d, es)
    return es


@njit(cache=True, nogil=True)
def latest_finish(topo, succ_ptr, succ_idx, d, deadline):
    """Latest finish of every node so that everything ends by ``deadline``."""
    lf = np.empty(d.shape[0])
    latest_finish_into(topo, succ_ptr, succ_idx, d, deadline, lf)
    return lf


@njit(cache=True, nogil=True)
def ready_time(pred_ptr, pred_idx, fin, v):
    """When node ``v`` can start: the latest finish ``fin`` among its predecessors."""
    st = 0.0
    for q in range(pred_ptr[v], pred_ptr[v + 1]):
        if fin[pred_idx[q]] > st:
            st = fin[pred_idx[q]]
    return st


@njit(cache=True, nogil=True)
def earliest_start_into(topo, pred_ptr, pred_idx, d, es):
    """:func:`earliest_start` written into ``es`` (no allocation)."""
    for v in topo:
        best = 0.0
        for q in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[q]
            f = es[u] + d[u]
            if f > best:
                best = f
        es[v] = best


@njit(cache=True, nogil=True)
def latest_finish_into(topo, succ_ptr, succ_idx, d, deadline, lf):
    """:func:`latest_finish` written into ``lf`` (no allocation)."""
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
    """Earliest finish of every node, and the least sum of ``a`` along a tight path into it.

    The sum is over the tight (longest) paths into the node, the node itself included.
    """
    n = d.shape[0]
    ef = np.zeros(n)
    ka = np.zeros(n)
    earliest_start_k_into(topo, pred_ptr, pred_idx, d, a, tol, ef, ka, np.empty(n))
    return ef, ka


@njit(cache=True, nogil=True)
def earliest_start_k_into(topo, pred_ptr, pred_idx, d, a, tol, ef, ka, es):
    """:func:`earliest_start_k` written into ``ef`` and ``ka``, the earliest starts into ``es``.

    No allocation; ``es`` is what :func:`earliest_start` gives for ``d``, bit for bit.
    """
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
        es[v] = best
        ef[v] = best + d[v]
        ka[v] = kbest + a[v]


@njit(cache=True, nogil=True)
def iteration_times(topo, pred_ptr, pred_idx, durations):
    """Longest path (iteration time) for each row of ``durations`` ``(k, n)``."""
    k = durations.shape[0]
    out = np.empty(k)
    for r in range(k):
        d = durations[r]
        out[r] = (earliest_start(topo, pred_ptr, pred_idx, d) + d).max()
    return out
