"""The relaxed frontier's breakpoints (``perseus.solver.breakpoints.RelaxedFrontier``).

The sweep in bounded memory keeps every breakpoint's time and cost but only as many durations as
fit, exact where kept, and interpolates durations that meet their deadlines everywhere.
"""

from __future__ import annotations

import numpy as np
from solver_instances import smooth

from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import (
    Relaxation,
    RelaxedFrontier,
    relaxed_frontier,
)


def test_the_sweep_keeps_a_bounded_number_of_durations_and_interpolates_feasibly() -> None:
    """With room for 64 breakpoints' durations, the sweep keeps at most that many.

    It keeps the slowest and the fastest among them, every breakpoint's time and cost, exact
    durations at the kept ones, and interpolations within their deadlines everywhere.
    """
    problem = EnergyProblem.build(smooth(4, 24), one_f_one_b(4, 8), 80.0)
    rel = Relaxation.build(problem)
    steps = list(relaxed_frontier(problem, rel))[::-1]
    assert len(steps) > 200
    full_t = np.array([s.time for s in steps])
    n = problem.num_nodes
    rf = RelaxedFrontier.sweep(problem, rel, memory=64 * 8 * n)
    assert len(rf.kept_times) <= 64 + 2
    assert np.array_equal(rf.times, full_t)
    assert np.array_equal(rf.costs, [s.cost for s in steps])
    assert rf.kept_times[0] == full_t[0] and rf.kept_times[-1] == full_t[-1]
    index = {t: i for i, t in enumerate(full_t)}
    for t, d in zip(rf.kept_times, rf.kept_durations, strict=True):
        assert np.array_equal(d, steps[index[t]].durations)
    deadlines = np.linspace(full_t[0], full_t[-1], 301)
    d = rf.durations_at(deadlines)
    assert np.all(problem.dag.iteration_time(d) <= deadlines * (1 + 1e-9))
    big = RelaxedFrontier.sweep(problem, rel, memory=1 << 30)
    assert np.array_equal(big.kept_times, full_t)  # room for all: all are kept
