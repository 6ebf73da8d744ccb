"""The relaxed sweep's kernel (``perseus.kernels.relaxed.relaxed_chunk``).

Each step augments the last step's maximum flow on the persistent graph; a flow that does not fit
the next network is rebuilt and repaired, and one larger than it carries is solved cold, the sweep
following the same breakpoints either way.
"""

from __future__ import annotations

import numpy as np
import pytest
from solver_instances import smooth

from perseus.kernels.flow import split_graph
from perseus.kernels.relaxed import relaxed_chunk
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import (
    Relaxation,
)


def _chunk(problem: EnergyProblem, rel: Relaxation, d, flows, kv, steps: int):
    """``steps`` relaxed steps from durations ``d`` and flows ``flows`` (updated in place)."""
    dag = problem.dag
    n = problem.num_nodes
    graph = split_graph(n, dag.src, dag.dst, np.diff(dag.pred_ptr) > 0, np.diff(dag.succ_ptr) > 0)
    work = (np.zeros(len(graph[1]), np.int64), np.empty(2 * n + 2, np.int64))
    t_min = float(dag.iteration_time(rel.shortest))
    keep = np.array([0.0, 1.0, float(dag.iteration_time(rel.longest)), 0.0, -1.0, np.inf])
    scale = min(1e6, 2.0**52 / (np.abs(rel.slope).max(axis=1).sum() + 1.0))
    times, costs, *_, d_next, done = relaxed_chunk(
        dag.topo, dag.pred_ptr, dag.pred_idx, dag.succ_ptr, dag.succ_idx, dag.src, dag.dst,
        rel.tau, rel.cost, rel.slope, rel.nv, rel.shortest, rel.longest,
        d, t_min, scale, 1 << 60, steps, *flows, kv, keep, *graph, *work,
    )  # fmt: skip
    return times, costs, d_next, done


def test_a_flow_that_does_not_fit_is_rebuilt_and_repaired() -> None:
    """Each step augments the last step's maximum flow on the persistent graph.

    A flow that does not fit the network (here: every flow dropped mid-sweep, below the lower
    bounds of the nodes between hull vertices) makes the step build its network alone and repair
    the flow, and the sweep follows the same breakpoints as without the interruption.
    """
    problem = EnergyProblem.build(smooth(4, 12, seed=5), one_f_one_b(4, 6), 80.0)
    rel = Relaxation.build(problem)
    n, m = problem.num_nodes, len(problem.dag.src)

    def fresh():
        z = np.zeros
        return (z(n, np.int64), z(m, np.int64), z(n, np.int64), z(n, np.int64)), rel.nv - 1

    flows, kv = fresh()
    ref_t, ref_c, _, done = _chunk(problem, rel, rel.longest.copy(), flows, kv, 100_000)
    assert done and len(ref_t) > 100
    flows, kv = fresh()
    t1, c1, d, _ = _chunk(problem, rel, rel.longest.copy(), flows, kv, len(ref_t) // 2)
    assert any(f.any() for f in flows)
    for f in flows:
        f[:] = 0
    t2, c2, _, done = _chunk(problem, rel, d, flows, kv, 100_000)
    assert done
    assert np.allclose(np.concatenate([t1, t2]), ref_t, rtol=1e-12)
    assert np.allclose(np.concatenate([c1, c2]), ref_c, rtol=1e-12)


def test_a_flow_larger_than_the_network_carries_is_solved_cold() -> None:
    """A last flow of more value than the next network can carry is solved cold.

    A last flow of more value than the next network can carry (integer rounding of the bounds
    can leave one a few units too large) cannot be repaired into it; the step solves its network
    from a zero flow instead, and the sweep still reaches the fastest time along the same
    breakpoints. (Dropping the lower bounds then, as the sweep once did, ended it early: on an
    interleaved 16 x 64 V=4 pipeline at 1.14 T0.)
    """
    problem = EnergyProblem.build(smooth(4, 12, seed=7), one_f_one_b(4, 6), 80.0)
    rel = Relaxation.build(problem)
    n, m = problem.num_nodes, len(problem.dag.src)

    def fresh():
        z = np.zeros
        return (z(n, np.int64), z(m, np.int64), z(n, np.int64), z(n, np.int64)), rel.nv - 1

    flows, kv = fresh()
    ref_t, ref_c, _, done = _chunk(problem, rel, rel.longest.copy(), flows, kv, 100_000)
    assert done and ref_t[-1] == pytest.approx(problem.dag.iteration_time(rel.shortest))
    flows, kv = fresh()
    t1, c1, d, _ = _chunk(problem, rel, rel.longest.copy(), flows, kv, len(ref_t) // 2)
    for f in flows:
        f *= 3  # still conserved, three times the value: no repair can keep that much
    t2, c2, _, done = _chunk(problem, rel, d, flows, kv, 100_000)
    assert done
    assert np.allclose(np.concatenate([t1, t2]), ref_t, rtol=1e-12)
    assert np.allclose(np.concatenate([c1, c2]), ref_c, rtol=1e-12)
