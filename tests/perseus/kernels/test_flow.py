"""The compiled max-flow / min-cut with lower bounds against networkx.

The kernels are :mod:`perseus.kernels.flow`; networkx is the independent oracle, on random small
networks.

The oracle computes the same answer another way: a flow of value at least ``F`` that respects
the lower bounds exists iff, on the usual transformed graph (capacities ``hi - lo``, each
vertex's lower-bound imbalance fed from a super source or drained to a super sink, and a return
arc ``t -> s`` carrying at least ``F``), networkx's maximum flow saturates the super source. The
largest such ``F`` (by bisection) is the maximum flow value, which equals the minimum cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perseus.kernels import dinic, min_cut_lower_bounds
from perseus.kernels.flow import split_graph

INF = 1 << 60  # what the solver passes as "unbounded"


@dataclass(frozen=True)
class Network:
    nn: int
    tail: np.ndarray
    head: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    start: np.ndarray  # a warm-start flow per arc (need not conserve flow)

    @property
    def s(self) -> int:
        return 0

    @property
    def t(self) -> int:
        return self.nn - 1


@st.composite
def networks(draw: st.DrawFn, lower_bounds: bool = True, unbounded: bool = True) -> Network:
    """Random networks of 2-7 vertices, shaped as the solver's time-cost networks.

    ``s = 0`` has no arcs in and ``t = nn - 1`` none out, as in the solver's time-cost networks
    (so every flow value is >= 0); parallel arcs and cycles allowed.
    """
    nn = draw(st.integers(2, 7))
    pairs = [(u, v) for u in range(nn - 1) for v in range(1, nn) if u != v]
    arcs = draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=14))
    tail, head, lo, hi, start = [], [], [], [], []
    for u, v in arcs:
        h = INF if unbounded and draw(st.integers(0, 5)) == 0 else draw(st.integers(0, 9))
        low = draw(st.integers(0, min(h, 4))) if lower_bounds and draw(st.booleans()) else 0
        tail.append(u)
        head.append(v)
        lo.append(low)
        hi.append(h)
        start.append(draw(st.integers(0, 12)))
    arr = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    return Network(nn, arr(tail), arr(head), arr(lo), arr(hi), arr(start))


def _feasible(net: Network, at_least: int) -> bool:
    """Whether a flow within the bounds, of value at least ``at_least``, exists.

    Networkx's maximum flow on the transformed graph decides.
    """
    g = nx.DiGraph()
    excess = np.zeros(net.nn, dtype=np.int64)

    def arc(u: object, v: object, cap: int | None) -> None:
        if g.has_edge(u, v):
            old = g[u][v].get("capacity")
            if old is None or cap is None:
                g[u][v].pop("capacity", None)  # unbounded
            else:
                g[u][v]["capacity"] = old + cap
        elif cap is None:
            g.add_edge(u, v)  # no capacity attribute: unbounded
        else:
            g.add_edge(u, v, capacity=cap)

    for u, v, lo, hi in zip(net.tail, net.head, net.lo, net.hi, strict=True):
        arc(int(u), int(v), None if hi >= INF else int(hi - lo))
        excess[v] += lo
        excess[u] -= lo
    arc(net.t, net.s, None)  # the return arc, with lower bound at_least
    excess[net.s] += at_least
    excess[net.t] -= at_least
    g.add_node("S")
    g.add_node("T")
    for v in range(net.nn):
        if excess[v] > 0:
            arc("S", v, int(excess[v]))
        elif excess[v] < 0:
            arc(v, "T", int(-excess[v]))
    need = int(excess[excess > 0].sum())
    return need == 0 or nx.maximum_flow_value(g, "S", "T") == need


def _unbounded(net: Network) -> bool:
    """Whether every cut is infinite: ``t`` is reachable from ``s`` along unbounded arcs."""
    g = nx.DiGraph()
    g.add_nodes_from(range(net.nn))
    g.add_edges_from(
        (int(u), int(v)) for u, v, h in zip(net.tail, net.head, net.hi, strict=True) if h >= INF
    )
    return nx.has_path(g, net.s, net.t)


def _max_flow_value(net: Network) -> int:
    """The largest flow value within the bounds, by bisection over :func:`_feasible`."""
    lo, hi = 0, int(net.hi[net.hi < INF].sum()) + 1  # feasible at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _feasible(net, mid) else (lo, mid)
    return lo


def _start_value(net: Network) -> int:
    """The warm start's flow into ``t``, clamped into the bounds as the kernel clamps it."""
    start = np.clip(net.start, net.lo, net.hi)
    return int(start[net.head == net.t].sum())


def _solve(net: Network, warm: bool) -> tuple[int, np.ndarray, np.ndarray]:
    flow = net.start.copy() if warm else np.zeros_like(net.start)
    status, side = min_cut_lower_bounds(
        net.nn, net.tail, net.head, net.lo, net.hi, net.s, net.t, INF, flow
    )
    return int(status), side, flow


def _check_flow(net: Network, flow: np.ndarray, value: int) -> None:
    assert np.all(flow >= net.lo) and np.all(flow <= net.hi)
    balance = np.zeros(net.nn, dtype=np.int64)
    np.add.at(balance, net.head, flow)
    np.subtract.at(balance, net.tail, flow)
    assert np.all(balance[1:-1] == 0)  # conserved everywhere but s and t
    assert -balance[net.s] == balance[net.t] == value


def _cut_value(net: Network, side: np.ndarray) -> int:
    fwd = side[net.tail] & ~side[net.head]
    bwd = ~side[net.tail] & side[net.head]
    return int(net.hi[fwd].sum() - net.lo[bwd].sum())


@settings(max_examples=300, deadline=None)
@given(networks(), st.booleans())
def test_min_cut_with_lower_bounds_matches_networkx(net: Network, warm: bool) -> None:
    """Status, cut value and flow all as networkx finds them.

    A warm start is repaired into a flow of at least its own inflow into ``t`` (see the kernel's
    docstring): status 2 says no such flow exists; from a cold start, that no flow within the
    bounds exists at all.
    """
    status, side, flow = _solve(net, warm)
    if not _feasible(net, _start_value(net) if warm else 0):
        assert status == 2
        return
    assert status != 2
    if _unbounded(net):
        assert status == 1
        return
    assert status == 0
    value = _max_flow_value(net)
    assert side[net.s] and not side[net.t]
    assert _cut_value(net, side) == value  # max-flow = min-cut, with lower bounds
    _check_flow(net, flow, value)


@settings(max_examples=200, deadline=None)
@given(networks(lower_bounds=False, unbounded=False), st.booleans())
def test_without_lower_bounds_it_is_networkx_minimum_cut(net: Network, warm: bool) -> None:
    """Plain capacities: the value and the cut are networkx's ``minimum_cut``'s.

    Any minimum cut may differ in its vertices, never in its value. From a zero start or from
    any warm start whose inflow into ``t`` a maximum flow can match.
    """
    status, side, flow = _solve(net, warm)
    g = nx.DiGraph()
    g.add_nodes_from(range(net.nn))
    for u, v, h in zip(net.tail, net.head, net.hi, strict=True):
        cap = g[u][v]["capacity"] if g.has_edge(u, v) else 0
        g.add_edge(int(u), int(v), capacity=cap + int(h))
    value, _ = nx.minimum_cut(g, net.s, net.t)
    if warm and _start_value(net) > value:  # no flow that large to repair the start into
        assert status == 2
        return
    assert status == 0
    assert _cut_value(net, side) == value
    _check_flow(net, flow, value)


def test_infeasible_lower_bounds_are_reported() -> None:
    """``s -> a`` allows at most 1 but ``a -> t`` needs at least 2."""
    net = Network(
        3,
        np.array([0, 1]),
        np.array([1, 2]),
        np.array([0, 2]),
        np.array([1, 5]),
        np.zeros(2, dtype=np.int64),
    )
    assert not _feasible(net, 0)
    assert _solve(net, warm=False)[0] == 2


@pytest.mark.parametrize("warm", [False, True])
def test_a_backward_lower_bound_lowers_the_cut(warm: bool) -> None:
    """``s -> a -> b -> t`` (capacity 4 each) and ``s -> b`` (1).

    Without lower bounds the maximum flow is 4. ``b -> a`` must carry at least 3 back, which ``a
    -> b`` must pass on, so only 1 more can enter ``a`` from ``s``: the maximum flow is 2, and
    the one minimum cut is ``{s, a}`` (forward ``a -> b`` 4 and ``s -> b`` 1, less backward ``b
    -> a``'s 3).
    """
    s_, a, b, t = 0, 1, 2, 3
    net = Network(
        4,
        np.array([s_, a, b, s_, b]),
        np.array([a, b, t, b, a]),
        np.array([0, 0, 0, 0, 3]),
        np.array([4, 4, 4, 1, 5]),
        np.ones(5, dtype=np.int64),
    )
    status, side, flow = _solve(net, warm)
    assert status == 0
    assert side.tolist() == [True, True, False, False]
    assert _cut_value(net, side) == 2 == _max_flow_value(net)
    _check_flow(net, flow, 2)
    plain = Network(net.nn, net.tail, net.head, np.zeros(5, dtype=np.int64), net.hi, net.start)
    assert _max_flow_value(plain) == 4


def test_an_unbounded_path_is_reported_after_the_repair_used_it() -> None:
    """``s -> a -> t`` unbounded, the start's 1 on ``a -> t`` repaired through ``s -> a``.

    Every cut is still infinite (the repair's flow must not hide the unbounded path).
    """
    net = Network(
        3,
        np.array([0, 0, 1]),
        np.array([1, 1, 2]),
        np.zeros(3, dtype=np.int64),
        np.array([INF, 0, INF]),
        np.array([0, 0, 1]),
    )
    assert _unbounded(net)
    assert _solve(net, warm=True)[0] == 1
    assert _solve(net, warm=False)[0] == 1


# --- the persistent node-split graph of the relaxed sweep -------------------------------------


@st.composite
def split_networks(draw: st.DrawFn) -> tuple[int, np.ndarray, np.ndarray, list[int], list[int]]:
    """A random DAG on 1-7 nodes, with capacities per node arc and per DAG edge.

    Edges go from lower to higher index. A node arc's capacity of 0 switches the node off,
    ``INF`` is unbounded; a DAG edge's is 0 or ``INF``.
    """
    n = draw(st.integers(1, 7))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    edges = sorted(set(draw(st.lists(st.sampled_from(pairs), max_size=12)))) if pairs else []
    src = np.array([u for u, _ in edges], dtype=np.int64)
    dst = np.array([v for _, v in edges], dtype=np.int64)
    node_cap = [INF if draw(st.integers(0, 6)) == 0 else draw(st.integers(0, 9)) for _ in range(n)]
    edge_cap = [draw(st.sampled_from([0, INF])) for _ in edges]
    return n, src, dst, node_cap, edge_cap


def _split_oracle(n, src, dst, node_cap, edge_cap) -> tuple[float, set[int]]:
    """Networkx's maximum flow value and the minimal source side of the node-split network.

    The minimal source side is what the residual graph of any maximum flow reaches from ``s``.
    """
    g = nx.DiGraph()
    s, t = 2 * n, 2 * n + 1
    g.add_nodes_from(range(2 * n + 2))

    def arc(u: int, v: int, cap: int) -> None:
        if cap >= INF:
            g.add_edge(u, v)
        elif cap > 0:
            g.add_edge(u, v, capacity=cap)

    for i in range(n):
        arc(2 * i, 2 * i + 1, node_cap[i])
        if i not in set(dst.tolist()):
            arc(s, 2 * i, INF)
        if i not in set(src.tolist()):
            arc(2 * i + 1, t, INF)
    for e in range(len(src)):
        arc(2 * int(src[e]) + 1, 2 * int(dst[e]), edge_cap[e])
    unbounded = nx.DiGraph()
    unbounded.add_nodes_from(g)
    unbounded.add_edges_from((u, v) for u, v, c in g.edges(data="capacity") if c is None)
    if nx.has_path(unbounded, s, t):
        return float("inf"), set()
    value, flows = nx.maximum_flow(g, s, t)
    res = nx.DiGraph()
    res.add_nodes_from(g)
    for u, v, c in g.edges(data="capacity"):
        f = flows[u][v]
        if c is None or f < c:
            res.add_edge(u, v)
        if f > 0:
            res.add_edge(v, u)
    return float(value), set(nx.descendants(res, s)) | {s}


@settings(max_examples=300, deadline=None)
@given(split_networks(), st.booleans())
def test_split_graph_max_flow_matches_networkx(net, warm: bool) -> None:
    """Capacities written into :func:`split_graph`'s layout, as a relaxed step writes them.

    :func:`dinic` finds networkx's maximum flow value and its minimal source side, from a zero
    flow and from a maximum flow of the same network with some capacities lowered first (the
    warm start of the sweep, which only ever raises a bound between steps).
    """
    n, src, dst, node_cap, edge_cap = net
    has_pred = np.zeros(n, dtype=np.bool_)
    has_succ = np.zeros(n, dtype=np.bool_)
    has_pred[dst] = True
    has_succ[src] = True
    ptr, to, frm, rev, node_pos, edge_pos, src_pos, snk_pos = split_graph(
        n, src, dst, has_pred, has_succ
    )
    assert np.all((src_pos >= 0) == ~has_pred) and np.all((snk_pos >= 0) == ~has_succ)
    assert sorted(np.concatenate([node_pos, edge_pos, src_pos[src_pos >= 0],
                                  snk_pos[snk_pos >= 0], rev[node_pos]]).tolist()) == sorted(
        set(np.concatenate([node_pos, edge_pos, src_pos[src_pos >= 0], snk_pos[snk_pos >= 0],
                            rev[node_pos]]).tolist()))  # fmt: skip
    assert np.all(rev[rev] == np.arange(len(to))) and np.all(frm[rev] == to)

    def capacities(node_c: list[int]) -> np.ndarray:
        cap = np.zeros(len(to), dtype=np.int64)
        cap[node_pos] = node_c
        cap[edge_pos] = edge_cap
        cap[src_pos[src_pos >= 0]] = INF
        cap[snk_pos[snk_pos >= 0]] = INF
        return cap

    level = np.empty(2 * n + 2, dtype=np.int64)
    s, t = 2 * n, 2 * n + 1
    cap = capacities(node_cap)
    pushed = 0
    if warm:  # a maximum flow with lowered node capacities, then the true ones on top of it
        low = [c // 2 if c < INF else c for c in node_cap]
        cap = capacities(low)
        pushed = dinic(2 * n + 2, ptr, to, cap, rev, frm, s, t, INF, level)
        if pushed < INF:
            fwd = node_pos
            flow = cap[rev[fwd]]
            cap[fwd] = [INF if c >= INF else c - f for c, f in zip(node_cap, flow, strict=True)]
    value, side = _split_oracle(n, src, dst, node_cap, edge_cap)
    if pushed >= INF:
        assert value == float("inf")
        return
    pushed += dinic(2 * n + 2, ptr, to, cap, rev, frm, s, t, INF, level)
    if value == float("inf"):
        assert pushed >= INF
        return
    assert pushed == value
    assert {v for v in range(2 * n + 2) if level[v] >= 0} == side
