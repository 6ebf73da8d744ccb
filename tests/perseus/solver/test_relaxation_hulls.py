"""The relaxation's hulls and path bound (``perseus.solver.relaxation``).

Thinned hulls lie below the exact ones within the tolerance, convex and exact at both ends; coarse
hulls are not thinned; the path bound lies below the relaxed frontier.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from solver_instances import smooth

from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import (
    Relaxation,
    RelaxedFrontier,
)
from perseus.solver.relaxation import THIN_MIN_VERTICES, path_bound, thin_hull


def test_the_path_bound_is_below_the_relaxed_frontier() -> None:
    problem = EnergyProblem.build(smooth(3, 12), one_f_one_b(3, 6), 80.0)
    rel = Relaxation.build(problem)
    rf = RelaxedFrontier.sweep(problem, rel, memory=1 << 20)
    for deadline in (rf.t_min, (rf.t_min + rf.t_max) / 2):
        a, flow = path_bound(problem, rel, deadline)
        assert flow >= 0
        assert np.all(a - flow * rf.times <= rf.costs + 1e-9 * np.abs(rf.costs))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.01, 1.0), min_size=2, max_size=40),
    st.lists(st.floats(0.01, 5.0), min_size=2, max_size=40),
    st.floats(0.0, 0.05),
)
def test_thin_hull_lies_below_within_tolerance(widths, bends, tol: float):
    """The thinned function is convex, below the original everywhere by at most ``tol``.

    It is exact at both ends, and has no more pieces.
    """
    k = min(len(widths), len(bends))
    tau = np.concatenate([[0.1], 0.1 + np.cumsum(widths[:k])])
    slopes = -np.cumsum(bends[:k])[::-1]  # increasing, negative
    cost = np.concatenate([[0.0], np.cumsum(slopes * np.diff(tau))])
    t2, c2 = thin_hull(tau, cost, tol)
    assert len(t2) <= len(tau)
    assert t2[0] == tau[0] and t2[-1] == tau[-1]
    assert c2[0] == cost[0] and c2[-1] == cost[-1]
    assert np.all(np.diff(t2) >= 0)
    s2 = np.diff(c2) / np.where(np.diff(t2) > 0, np.diff(t2), 1.0)
    assert np.all(np.diff(s2[np.diff(t2) > 1e-12]) >= -1e-9)  # convex
    x = np.linspace(tau[0], tau[-1], 4001)
    below = np.interp(x, tau, cost) - np.interp(x, t2, c2)
    scale = 1.0 + np.abs(cost).max()
    assert below.min() >= -1e-9 * scale
    assert below.max() <= tol + 1e-9 * scale


def test_coarse_hulls_are_swept_exactly():
    """Hulls of fewer than THIN_MIN_VERTICES vertices are not thinned."""
    problem = EnergyProblem.build(smooth(4, THIN_MIN_VERTICES - 1), one_f_one_b(4, 4), 80.0)
    rel = Relaxation.build(problem)
    assert rel.under_estimate(np.ones(problem.num_nodes), 0.05) is rel
    assert rel.under_estimate(np.ones(problem.num_nodes), 0.0) is rel
