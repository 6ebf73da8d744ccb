"""Fault points: the named places where a test may stop or slow the server.

Production code marks, with one call each, the steps a crash test interrupts
(:func:`fault_point`, at each of :data:`POINTS`: between a store and its commit, after a commit
and before the push, ...) and the phases a timing test stretches (:func:`test_delay`: a solve's
partial frontier, the kernel warm-up at start). The crash tests start a real server stopped at
each point and check that after a restart every endpoint answers and the state is the one before
or after the step.

The seam is inert unless a test installs hooks (:mod:`perseus_server.testing.fault_hooks`): in its
own process with :func:`install`, or in a real server and the solve workers it spawns through
their environment, which each process reads where a point is reached: :data:`FAULT_ENV` names the
point to stop at (the process exits at once, ``os._exit`` with :data:`FAULT_EXIT_CODE`, no
cleanup, as a kill would), :data:`TEST_SOLVE_DELAY_ENV` and :data:`TEST_WARM_DELAY_ENV` the
seconds to wait. Inert, a point costs a dictionary and an environment lookup.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

__all__ = [
    "FAULT_ENV",
    "FAULT_EXIT_CODE",
    "POINTS",
    "DELAYS",
    "TEST_SOLVE_DELAY_ENV",
    "TEST_WARM_DELAY_ENV",
    "fault_point",
    "test_delay",
    "install",
    "uninstall",
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
#: Every stretchable phase, named by its environment variable.
DELAYS = (TEST_SOLVE_DELAY_ENV, TEST_WARM_DELAY_ENV)

_hooks: dict[str, Callable[[], None]] = {}
_delays: dict[str, float] = {}


def fault_point(name: str) -> None:
    """Run the hook installed at this point; without one, exit if ``PERSEUS_FAULT`` names it."""
    hook = _hooks.get(name)
    if hook is not None:
        hook()
    elif os.environ.get(FAULT_ENV) == name:
        os._exit(FAULT_EXIT_CODE)


def test_delay(name: str) -> float:
    """The seconds the phase ``name`` waits: installed, else its variable (0 when unset or bad)."""
    if name in _delays:
        return _delays[name]
    try:
        return max(0.0, float(os.environ.get(name, "0") or 0))
    except ValueError:
        return 0.0


def install(
    points: Mapping[str, Callable[[], None]] | None = None,
    delays: Mapping[str, float] | None = None,
) -> None:
    """Install hooks in this process: a callable per point, seconds per phase.

    Raises ``ValueError`` naming a point or phase that does not exist (a hook that could never
    run would make a test pass vacuously).
    """
    points, delays = dict(points or {}), dict(delays or {})
    unknown = sorted(set(points) - set(POINTS)) + sorted(set(delays) - set(DELAYS))
    if unknown:
        raise ValueError(f"fault hooks: no such point or phase: {', '.join(unknown)}")
    _hooks.update(points)
    _delays.update({name: max(0.0, float(s)) for name, s in delays.items()})


def uninstall() -> None:
    """Remove every hook installed in this process (the environment's still apply)."""
    _hooks.clear()
    _delays.clear()
