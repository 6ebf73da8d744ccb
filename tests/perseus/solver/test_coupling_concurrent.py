"""The planning and the bounding relaxations of per-clock transfers, on two threads.

With more than one core the two run at once: the frontier is the one the two run one after the
other give, exactly; a failure or a cancel on either side stops both.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from test_problem_communication import full_communication, random_profile

import perseus.solver.solve as solve_module
from perseus.errors import SolverCancelled
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import SolverOptions, solve_problem

P_BLOCK = 70.38


def clocked_problem(stages: int = 4, microbatches: int = 8, seed: int = 5) -> EnergyProblem:
    """A random 1F1B problem with per-clock transfers on every boundary."""
    prof = random_profile(stages, seed).with_communication(
        full_communication(stages, seed, clocked=True)
    )
    return EnergyProblem.build(prof, one_f_one_b(stages, microbatches), P_BLOCK)


def test_concurrent_relaxations_give_the_sequential_frontier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = clocked_problem()
    assert problem.producer_charged() is not problem.cost_charged()
    calls: list[str] = []
    real = solve_module._concurrently

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(solve_module, "_concurrently", spy)
    sequential = solve_problem(problem, SolverOptions(workers=1))
    assert calls == []  # one core: one after the other
    both = solve_problem(problem, SolverOptions(workers=2))
    assert len(calls) == 1  # two cores, too few nodes for the range sweep: two threads
    np.testing.assert_array_equal(both.bound_times, sequential.bound_times)
    np.testing.assert_array_equal(both.bound_energies, sequential.bound_energies)
    np.testing.assert_array_equal(both.times, sequential.times)
    np.testing.assert_array_equal(both.energies, sequential.energies)
    np.testing.assert_array_equal(both.lower_bounds, sequential.lower_bounds)
    np.testing.assert_array_equal(both.plans, sequential.plans)
    assert np.all(both.lower_bounds <= both.energies * (1 + 1e-12))


def test_concurrently_runs_both_and_returns_in_order() -> None:
    names: list[str] = []

    def first(stop):  # type: ignore[no-untyped-def]
        names.append(threading.current_thread().name)
        return 1

    def second(stop):  # type: ignore[no-untyped-def]
        names.append(threading.current_thread().name)
        return "two"

    assert solve_module._concurrently(first, second, None) == (1, "two")
    assert len(set(names)) == 2  # the second on its own thread


def _waits_for_stop(stop):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while not stop():
        if time.monotonic() > deadline:
            raise AssertionError("never told to stop")
        time.sleep(0.001)
    raise SolverCancelled("stopped")


def _fails(stop):  # type: ignore[no-untyped-def]
    raise ValueError("broken relaxation")


@pytest.mark.parametrize("failing", ["first", "second"])
def test_a_failure_on_one_side_stops_the_other_and_is_raised(failing: str) -> None:
    pair = (_fails, _waits_for_stop) if failing == "first" else (_waits_for_stop, _fails)
    with pytest.raises(ValueError, match="broken relaxation"):
        solve_module._concurrently(pair[0], pair[1], None)


def test_cancel_reaches_both_sides() -> None:
    flag = threading.Event()
    seen = []

    def first(stop):  # type: ignore[no-untyped-def]
        flag.set()
        try:
            _waits_for_stop(stop)
        except SolverCancelled:
            seen.append("first")
            raise

    def second(stop):  # type: ignore[no-untyped-def]
        try:
            _waits_for_stop(stop)
        except SolverCancelled:
            seen.append("second")
            raise

    with pytest.raises(SolverCancelled):
        solve_module._concurrently(first, second, flag.is_set)
    assert sorted(seen) == ["first", "second"]


def test_a_cancelled_solve_with_concurrent_relaxations_raises() -> None:
    problem = clocked_problem()
    with pytest.raises(SolverCancelled):
        solve_problem(problem, SolverOptions(workers=2), cancel=lambda: True)
