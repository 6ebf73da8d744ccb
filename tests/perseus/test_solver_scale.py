"""The solver at scale.

Bounded relaxed memory, the early zero-slowdown plan, deep pipelines, and kernels compiled ahead of
time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lp_reference import lp_lower_bound

from perseus.frontier import Frontier
from perseus.kernels.cache import cache_dir_for, configure_cache
from perseus.kernels.flow import split_graph
from perseus.kernels.relaxed import relaxed_chunk
from perseus.problem import EnergyProblem
from perseus.profiles import InstructionProfile, Profile
from perseus.schedules import interleaved_1f1b, one_f_one_b
from perseus.solver import (
    Relaxation,
    RelaxedFrontier,
    SolverOptions,
    first_plan,
    relaxed_frontier,
    solve_problem,
)
from perseus.solver.relaxation import THIN_MIN_VERTICES, path_bound, thin_hull
from perseus.solver.rounder import Rounder

REL = 1e-9
ROOT = Path(__file__).resolve().parents[2]


def smooth(stages: int, clocks: int, seed: int = 0) -> Profile:
    """A DVFS-model profile, stages a little different from each other.

    Time = memory part + compute part x fmax/f, power = static + dynamic x (f/fmax)^3.
    """
    rng = np.random.default_rng(seed)
    f = 1980 - 15 * np.arange(clocks)
    x = f / f[0]
    entries = {}
    for s in range(stages):
        w = 1 + 0.1 * rng.random()
        for kind, mult in (("forward", 1.0), ("backward", 2.0)):
            t = mult * w * (0.008 + 0.04 / x)
            e = (90 + 310 * x ** (2.5 + rng.random())) * t
            entries[(s, kind)] = InstructionProfile(f.astype(np.int64), t, e)
    return Profile(entries)


def check_frontier(problem: EnergyProblem, fr: Frontier) -> None:
    t, e = problem.evaluate_many(fr.plans)
    assert np.allclose(t, fr.times, rtol=REL) and np.allclose(e, fr.energies, rtol=REL)
    assert fr.times[0] <= fr.max_frequency_time * (1 + REL)
    assert np.all(fr.lower_bounds <= fr.energies * (1 + REL))
    assert fr.plans.dtype == np.uint8


# --- bounded relaxed memory ------------------------------------------------------------------


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


def test_a_small_relaxed_memory_keeps_the_bound_and_valid_plans() -> None:
    problem = EnergyProblem.build(smooth(4, 32), one_f_one_b(4, 12), 80.0)
    small = solve_problem(problem, SolverOptions(relaxed_memory=1))
    full = solve_problem(problem)
    check_frontier(problem, small)
    assert np.array_equal(small.bound_times, full.bound_times)
    t0 = full.max_frequency_time
    for f in (1.0, 1.02, 1.1):
        assert small.energy_at(f * t0) <= full.energy_at(f * t0) * 1.01


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


# --- the early zero-slowdown plan -----------------------------------------------------------


def test_the_first_plan_comes_before_the_sweep_and_is_certified() -> None:
    """The first plan comes before any progress of the sweep, and it is certified.

    One call, before any progress of the sweep, with one verified zero-slowdown point whose
    bound is below the exact relaxed bound at every deadline; the final frontier's fastest plan
    is at least as good.
    """
    problem = EnergyProblem.build(smooth(4, 16), one_f_one_b(4, 8), 80.0)
    progress: list[float] = []
    got: list[tuple[int, Frontier]] = []
    fr = solve_problem(
        problem,
        progress=progress.append,
        on_first_plan=lambda f: got.append((len(progress), f)),
    )
    assert len(got) == 1
    seen, early = got[0]
    assert seen == 0
    assert len(early) == 1 and early.plans.shape == (1, problem.num_nodes)
    check_frontier(problem, early)
    assert early.times[0] <= early.max_frequency_time * (1 + REL)
    assert early.energies[0] < early.max_frequency_energy
    assert early.lower_bounds[0] == pytest.approx(early.lower_bound_at(float(early.times[0])))
    t0 = fr.max_frequency_time
    for f in np.linspace(1.0, 3.0, 41):
        assert early.lower_bound_at(f * t0) <= fr.lower_bound_at(f * t0) * (1 + REL)
    assert fr.energy_at(t0) <= early.energy_at(t0) * (1 + REL)
    again = Frontier.from_json(early.to_json(compact=True))
    assert np.array_equal(again.plans, early.plans)


def test_the_path_bound_is_below_the_relaxed_frontier() -> None:
    problem = EnergyProblem.build(smooth(3, 12), one_f_one_b(3, 6), 80.0)
    rel = Relaxation.build(problem)
    rf = RelaxedFrontier.sweep(problem, rel, memory=1 << 20)
    for deadline in (rf.t_min, (rf.t_min + rf.t_max) / 2):
        a, flow = path_bound(problem, rel, deadline)
        assert flow >= 0
        assert np.all(a - flow * rf.times <= rf.costs + 1e-9 * np.abs(rf.costs))


def test_first_plan_falls_back_to_max_frequency_when_nothing_can_slow() -> None:
    """A single option per node: the first plan is the all-max-frequency plan."""
    f = np.array([1410], dtype=np.int64)
    prof = Profile(
        {(s, k): InstructionProfile(f, np.array([0.01]), np.array([1.0]))
         for s in range(2) for k in ("forward", "backward")}
    )  # fmt: skip
    problem = EnergyProblem.build(prof, one_f_one_b(2, 2), 50.0)
    rel = Relaxation.build(problem)
    early = first_plan(problem, rel, Rounder(problem, rel))
    assert np.array_equal(early.plans[0], problem.max_frequency_plan())
    assert early.lower_bounds[0] <= early.energies[0] * (1 + REL)


# --- deep pipelines --------------------------------------------------------------------------


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(16, 32),
    st.integers(1, 3),
    st.integers(3, 12),
    st.floats(0.0, 150.0),
    st.integers(0, 2**16),
)
def test_deep_pipelines(stages: int, microbatches: int, clocks: int, power: float, seed: int):
    """16-32 stages, few microbatches.

    Plans are truly evaluated, the fastest within T0, every point above its bound, and the bound
    equal to an independent LP's at T0 and 1.1 T0.
    """
    problem = EnergyProblem.build(
        smooth(stages, clocks, seed), one_f_one_b(stages, microbatches), power
    )
    fr = solve_problem(problem, SolverOptions(effort=0.0))
    check_frontier(problem, fr)
    for f in (1.0, 1.1):
        d = f * fr.max_frequency_time
        assert fr.lower_bound_at(d) == pytest.approx(lp_lower_bound(problem, d).value, rel=1e-6)


def test_deep_interleaved_pipeline() -> None:
    problem = EnergyProblem.build(smooth(16, 8), interleaved_1f1b(16, 16, 2), 80.0)
    fr = solve_problem(problem, SolverOptions(effort=0.0))
    check_frontier(problem, fr)
    t0 = fr.max_frequency_time
    assert fr.energy_at(t0) / fr.lower_bound_at(t0) - 1 < 0.02


# --- kernels compiled ahead of time ----------------------------------------------------------


def test_a_read_only_install_gets_a_seeded_writable_cache(tmp_path: Path) -> None:
    """A read-only install gets a writable numba cache, seeded with the compiled kernels.

    When the package's ``__pycache__`` cannot be written, numba's cache goes to the first
    writable root, seeded with the up-to-date compiled kernels (stale ones are not copied).
    """
    from numba.core import config

    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "k.py").write_text("")
    fresh = pkg / "__pycache__" / "k.f-1.py311.nbi"
    stale = pkg / "__pycache__" / "k.g-1.py311.nbi"
    fresh.write_text("index")
    stale.write_text("old")
    import os

    os.utime(pkg / "k.py", (2_000, 2_000))
    os.utime(stale, (1_000, 1_000))
    bad, good = tmp_path / "bad", tmp_path / "good"
    before = config.CACHE_DIR
    try:
        root = configure_cache(pkg, writable=lambda p: p == good, roots=[bad, good])
        assert root == good and config.CACHE_DIR == str(good)
        target = cache_dir_for(pkg, good)
        assert (target / fresh.name).read_text() == "index"
        assert not (target / stale.name).exists()
        config.CACHE_DIR = before
        assert configure_cache(pkg, writable=lambda p: True) is None  # in-tree: unchanged
        assert config.CACHE_DIR == before
    finally:
        config.CACHE_DIR = before


def test_warm_leaves_nothing_to_compile() -> None:
    """After ``python -m perseus.kernels.warm``, a fresh process compiles nothing.

    The tests' own process has run the kernels already.
    """
    for args in ([], ["--check"]):  # the first compiles whatever a cold cache lacks
        out = subprocess.run(
            [sys.executable, "-m", "perseus.kernels.warm", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert out.returncode == 0, out.stderr
    assert " 0 compiled now" in out.stdout


# --- fewer hull pieces for the sweep ---------------------------------------------------------


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


def test_thinned_sweep_bound_is_certified_and_close():
    """On a fine-grained profile the sweep on thinned hulls visits fewer breakpoints.

    Its bound lies below the independent LP's (on the exact hulls) and within ``hull_tolerance``
    of the energy of it; with ``hull_tolerance=0`` it equals the LP's.
    """
    problem = EnergyProblem.build(smooth(4, 48, seed=3), one_f_one_b(4, 6), 80.0)
    tol = 2e-3
    thin = solve_problem(problem, SolverOptions(effort=0.0, hull_tolerance=tol))
    exact = solve_problem(problem, SolverOptions(effort=0.0, hull_tolerance=0.0))
    check_frontier(problem, thin)
    assert len(thin.bound_times) < 0.8 * len(exact.bound_times)
    floor = problem.energies.min(axis=1).sum()  # every option is valid in this profile
    for f in (1.0, 1.02, 1.1, 1.3):
        d = f * thin.max_frequency_time
        ref = lp_lower_bound(problem, d).value
        assert exact.lower_bound_at(d) == pytest.approx(ref, rel=1e-6)
        assert thin.lower_bound_at(d) <= ref * (1 + 1e-9)
        assert thin.lower_bound_at(d) >= ref - tol * floor - 1e-9 * ref
