"""Named crash points for fault-injection tests.

With ``PERSEUS_FAULT=<name>`` in its environment, the server process exits at once
(``os._exit``, no cleanup, as a kill would) when it reaches :func:`fault_point` ``(name)``. The
crash tests start a real server with each name and check that after a restart every endpoint
answers and the state is the one before or after the step. Without the variable, a point costs
one environment lookup.
"""

from __future__ import annotations

import os

__all__ = ["FAULT_ENV", "FAULT_EXIT_CODE", "POINTS", "fault_point"]

FAULT_ENV = "PERSEUS_FAULT"
#: The exit status of a process stopped at a fault point.
FAULT_EXIT_CODE = 86

#: Every named point, in the order a solve, a deployment and a profiling finish reach them.
POINTS = (
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
