"""The sweep beside the rounding (:mod:`perseus.solver.pipeline`).

Windows of deadlines are handed over while the sweep still runs, each with a bound exact on it;
the pipelined solve's bound is the sweep's, bit for bit; its frontier does not depend on the
threads, every point is a true plan, and its gaps are those of a solve without the pipeline;
small problems keep their frontiers (no pipeline below ``PIPELINE_MIN_NODES``); a cancel or a
failure on either side stops both.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import perseus.solver.pipeline as pipeline
from perseus.errors import SolverCancelled
from perseus.problem import EnergyProblem
from perseus.profiles import Profile
from perseus.schedules import interleaved_1f1b, one_f_one_b
from perseus.solver import SolverOptions, solve_problem
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.relaxation import Relaxation
from perseus.solver.solve import SolveStats

P_A100 = 83.64
REL = 1e-9


def tiled(a100: Profile, stages: int) -> Profile:
    return Profile({(s, k): a100[(s % a100.stages, k)] for s in range(stages) for k in a100.kinds})


@pytest.fixture
def problem(a100: Profile) -> EnergyProblem:
    return EnergyProblem.build(tiled(a100, 8), one_f_one_b(8, 24), P_A100)


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline from any size (its threshold is a size the tests cannot afford)."""
    monkeypatch.setattr(pipeline, "PIPELINE_MIN_NODES", 0)


def test_windows_are_handed_over_while_the_sweep_runs(problem: EnergyProblem) -> None:
    """Every window but the fastest comes before the sweep ends, in order, its bound exact.

    Each window's frontier is the sweep's above its lower end: the same bound there as the whole
    sweep's, its kept durations reaching at or below it.
    """
    rel = Relaxation.build(problem)
    # Whether the sweep's thread still runs when a window's work starts is up to the scheduler
    # (a window handed over last may be taken up after the sweep ended); that each was cut
    # before the sweep reached its end is read off its data below.
    seen: list[pipeline.Window] = []

    def work(w: pipeline.Window) -> None:
        seen.append(w)

    stats = pipeline.SweepStats()
    final = pipeline.overlapped(problem, rel, work, memory=2**20, stats=stats)
    whole = RelaxedFrontier.sweep(problem, rel, memory=2**20)
    np.testing.assert_array_equal(final.times, whole.times)
    np.testing.assert_array_equal(final.costs, whole.costs)
    assert stats.early_windows == len(seen) - 1 >= pipeline.SEGMENTS - 2
    windows = seen
    assert windows[0].hi == final.t_max and windows[-1].lo == final.t_min
    for a, b in zip(windows[:-1], windows[1:], strict=True):
        assert a.lo == b.hi  # consecutive, from the slowest
    assert sum(w.share for w in windows) == pytest.approx(1.0)
    for w in windows[:-1]:
        assert w.relaxed.times[0] > final.t_min  # handed over before the sweep ended
        assert w.relaxed.kept_times[0] <= w.lo
        grid = np.linspace(w.lo, w.hi, 50)
        np.testing.assert_allclose(w.relaxed.bound(grid), final.bound(grid), rtol=1e-12)
        d = w.relaxed.durations_at(grid)
        assert (problem.dag.iteration_time(d) <= grid * (1 + REL)).all()


def test_the_pipelined_solve_keeps_the_bound_and_is_reproducible(
    problem: EnergyProblem, piped: None
) -> None:
    """The bound is the sweep's, the frontier the same on 1 and 2 threads, every point true."""
    st = SolveStats()
    one = solve_problem(problem, SolverOptions(workers=1), stats=st)
    two = solve_problem(problem, SolverOptions(workers=2))
    assert st.sweep is not None and st.sweep.early_windows >= 1 and st.sweep.cpu > 0
    for a, b in ((one.times, two.times), (one.energies, two.energies), (one.plans, two.plans)):
        np.testing.assert_array_equal(a, b)
    rel = Relaxation.build(problem)
    whole = RelaxedFrontier.sweep(problem, rel, memory=SolverOptions().relaxed_memory)
    np.testing.assert_array_equal(one.bound_times, whole.relaxed_bound.times)
    t, e = problem.evaluate_many(one.plans)
    assert np.allclose(t, one.times, rtol=REL) and np.allclose(e, one.energies, rtol=REL)
    assert one.times[0] <= one.max_frequency_time * (1 + REL)
    assert np.all(one.lower_bounds <= one.energies * (1 + REL))


@pytest.mark.parametrize("virtual", [1, 2])
def test_the_pipelined_plans_are_as_close_to_the_bound(
    a100: Profile, monkeypatch: pytest.MonkeyPatch, virtual: int
) -> None:
    """Gaps at T0..1.2 T0 within 0.5 %; worst and mean over the range within 1.1x the plain's."""
    sched = one_f_one_b(8, 24) if virtual == 1 else interleaved_1f1b(4, 12, 2)
    problem = EnergyProblem.build(tiled(a100, 8), sched, P_A100)
    plain = solve_problem(problem)
    monkeypatch.setattr(pipeline, "PIPELINE_MIN_NODES", 0)
    piped = solve_problem(problem)
    t0 = plain.max_frequency_time
    grid = np.linspace(t0, 1.5 * t0, 400)

    def gaps(fr):  # type: ignore[no-untyped-def]
        return np.array([fr.energy_at(x) / fr.lower_bound_at(x) - 1 for x in grid])

    a, b = gaps(plain), gaps(piped)
    for f in (1.0, 1.02, 1.05, 1.1, 1.2):
        assert piped.energy_at(f * t0) / piped.lower_bound_at(f * t0) - 1 <= 0.005
    assert b.max() <= 1.1 * a.max() and b.mean() <= 1.1 * a.mean()


def test_small_problems_keep_their_frontier(problem: EnergyProblem) -> None:
    """Below ``PIPELINE_MIN_NODES`` there is no pipeline: the frontier stays what it was."""
    st = SolveStats()
    solve_problem(problem, stats=st)
    assert problem.num_nodes < pipeline.PIPELINE_MIN_NODES and st.sweep is None


def test_a_cancel_or_a_failure_stops_both_sides(problem: EnergyProblem) -> None:
    """A cancel ends the sweep; an exception in a window's work stops the sweep and propagates."""
    rel = Relaxation.build(problem)
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(SolverCancelled):
        pipeline.overlapped(problem, rel, lambda w: None, memory=2**20, cancel=cancel)

    def fail(w: pipeline.Window) -> None:
        raise ValueError("a window's work failed")

    with pytest.raises(ValueError, match="window's work failed"):
        pipeline.overlapped(problem, rel, fail, memory=2**20)
    assert not any(t.name == "perseus-sweep" for t in threading.enumerate())
