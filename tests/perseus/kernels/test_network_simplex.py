"""The network simplex kernel (``perseus.kernels.network_simplex``) against networkx.

Random circulation networks solved cold, then warm started from the last spanning tree after some
costs change: the optimal cost equals networkx's, and the reduced costs prove optimality.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from perseus.kernels.network_simplex import init_tree, reprice, simplex


class Net:
    """A random circulation network for the kernel, and the same as a networkx graph.

    The network has a return arc whose cost is changed.
    """

    def __init__(self, rng: np.random.Generator, nn: int, m: int) -> None:
        pairs = {(int(a), int(b)) for a, b in rng.integers(0, nn, (m, 2)) if a != b}
        self.arcs = sorted(pairs)
        self.nn = nn
        self.src = np.array([a for a, _ in self.arcs] + list(range(nn)), np.int64)
        self.dst = np.array([b for _, b in self.arcs] + [nn] * nn, np.int64)
        k = len(self.arcs)
        self.cap = np.r_[rng.integers(1, 20, k), np.full(nn, 1 << 40)].astype(np.int64)
        self.cost = np.r_[rng.integers(-10, 30, k), np.zeros(nn)].astype(np.int64)
        big = 3 * (int(np.abs(self.cost).sum()) + 1000) + 1
        self.cost[k:] = big
        self.flow = np.zeros(len(self.src), np.int64)
        self.tree = list(init_tree(nn, big))
        self.tree[1][:nn] = k + np.arange(nn)
        self.state = np.zeros(3, np.int64)

    def solve(self) -> int:
        parent, pedge, size, nxt, prv, last, pi = self.tree
        reprice(self.src, self.dst, self.cost, parent, pedge, nxt, pi, self.nn)
        assert simplex(
            self.src, self.dst, self.cap, self.cost, self.flow, parent, pedge, size, nxt, prv,
            last, pi, self.state, 10**7,
        )  # fmt: skip
        k = len(self.arcs)
        assert not self.flow[k:].any()
        # optimality: reduced costs against the flows
        rc = self.cost - pi[self.src] + pi[self.dst]
        assert (rc[self.flow < self.cap] >= 0).all() and (rc[self.flow > 0] <= 0).all()
        return int((self.cost[:k] * self.flow[:k]).sum())

    def networkx_cost(self) -> int:
        g = nx.DiGraph()
        g.add_nodes_from(range(self.nn))
        for i, (a, b) in enumerate(self.arcs):
            g.add_edge(a, b, capacity=int(self.cap[i]), weight=int(self.cost[i]))
        return int(nx.min_cost_flow_cost(g))


@pytest.mark.parametrize("seed", range(12))
def test_network_simplex_matches_networkx_cold_and_warm(seed: int) -> None:
    rng = np.random.default_rng(seed)
    net = Net(rng, int(rng.integers(4, 30)), int(rng.integers(5, 120)))
    assert net.solve() == net.networkx_cost()
    for _ in range(4):  # change some costs, resume from the last tree
        k = len(net.arcs)
        idx = rng.integers(0, k, max(1, k // 5))
        net.cost[idx] = rng.integers(-10, 30, len(idx))
        assert net.solve() == net.networkx_cost()
