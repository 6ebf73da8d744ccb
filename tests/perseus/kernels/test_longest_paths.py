"""The longest-path kernels (``perseus.kernels.longest_paths``).

The Newton pass's earliest starts (``earliest_start_k_into``) are bit for bit the plain pass's
(``earliest_start``) of the same durations.
"""

from __future__ import annotations

import numpy as np

from benchmarks.scaling import Config, build_problem
from perseus.kernels.longest_paths import earliest_start, earliest_start_k_into


def test_the_newton_pass_gives_the_earliest_starts_bit_for_bit() -> None:
    """``earliest_start_k_into``'s ``es`` is :func:`earliest_start` of the same durations."""
    problem = build_problem(Config("smooth", 4, 16))
    dag = problem.dag
    rng = np.random.default_rng(7)
    n = problem.num_nodes
    for _ in range(5):
        d = rng.uniform(0.01, 0.2, n)
        a = rng.choice([-1.0, 0.0, 1.0], n)
        ef, ka, es = np.empty(n), np.empty(n), np.full(n, np.nan)
        earliest_start_k_into(dag.topo, dag.pred_ptr, dag.pred_idx, d, a, 1e-9, ef, ka, es)
        want = earliest_start(dag.topo, dag.pred_ptr, dag.pred_idx, d)
        assert np.array_equal(es, want)
        assert np.array_equal(ef, want + d)
