"""Named crash points for fault-injection tests.

With ``PERSEUS_FAULT=<name>`` in its environment, the server process exits at once
(``os._exit``, no cleanup, as a kill would) when it reaches :func:`fault_point` ``(name)``. The
crash tests start a real server with each name and check that after a restart every endpoint
answers and the state is the one before or after the step. Without the variable, a point costs
one environment lookup.

Two test-only delays (:data:`TEST_SOLVE_DELAY_ENV`, :data:`TEST_WARM_DELAY_ENV`) stretch the
phases a test watches (a solve's partial frontier, the kernel warm-up at start); unset, they
cost one lookup each.
"""

from __future__ import annotations

import os

__all__ = [
    "FAULT_ENV",
    "FAULT_EXIT_CODE",
    "POINTS",
    "TEST_SOLVE_DELAY_ENV",
    "TEST_WARM_DELAY_ENV",
    "fault_point",
    "test_delay",
]

FAULT_ENV = "PERSEUS_FAULT"
#: Test-only: seconds a solve worker waits after sending its first plan (the partial phase made
#: long enough to watch; the wait ends early when the solve is cancelled).
TEST_SOLVE_DELAY_ENV = "PERSEUS_TEST_SOLVE_DELAY"
#: Test-only: seconds the server waits before it warms the solver's kernels at start.
TEST_WARM_DELAY_ENV = "PERSEUS_TEST_WARM_DELAY"
#: The exit status of a process stopped at a fault point.
FAULT_EXIT_CODE = 86

#: Every named point, in the order a solve, a deployment and a profiling finish reach them.
POINTS = (
    "after_partial_store",  # first plan: partial frontier written, deployment not yet (one tx)
    "after_partial_commit",  # first plan: committed and deployed, the rest still solving
    "after_frontier_store",  # solve done: frontier written, deployment not yet (one transaction)
    "after_solve_commit",  # solve done: committed, not yet pushed to the ranks
    "after_deployment_store",  # PUT plan: deployment written, not yet committed
    "after_profile_store",  # profiling finish: measured profile written, not yet committed
    "after_profiling_commit",  # profiling finish: committed, solve queued
)


def fault_point(name: str) -> None:
    """Exit the process now if ``PERSEUS_FAULT`` names this point."""
    if os.environ.get(FAULT_ENV) == name:
        os._exit(FAULT_EXIT_CODE)


def test_delay(name: str) -> float:
    """The seconds the test-only variable ``name`` asks for (0 when unset or unreadable)."""
    try:
        return max(0.0, float(os.environ.get(name, "0") or 0))
    except ValueError:
        return 0.0
