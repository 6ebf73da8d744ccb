"""Fault injection from the tests' side: the hooks they install in the server's fault points.

The points themselves are production's seam, :mod:`perseus_server.runtime.faults` (inert until
hooks are installed); production code imports nothing of ``testing``. A test reaches a real
server (and the solve workers it spawns) through the environment it starts it with
(:data:`FAULT_ENV`: stop at a point; :data:`TEST_SOLVE_DELAY_ENV`, :data:`TEST_WARM_DELAY_ENV`:
stretch a phase), and its own process with :func:`installed`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from perseus_server.runtime.faults import (
    FAULT_ENV,
    FAULT_EXIT_CODE,
    POINTS,
    TEST_SOLVE_DELAY_ENV,
    TEST_WARM_DELAY_ENV,
    install,
    uninstall,
)

__all__ = [
    "FAULT_ENV",
    "FAULT_EXIT_CODE",
    "POINTS",
    "TEST_SOLVE_DELAY_ENV",
    "TEST_WARM_DELAY_ENV",
    "installed",
    "server_env",
]


def server_env(
    *, stop_at: str | None = None, solve_delay: float | None = None, warm_delay: float | None = None
) -> dict[str, str]:
    """The environment that installs these hooks in a server a test starts.

    ``stop_at``: the point where it exits (:data:`FAULT_EXIT_CODE`); the delays in seconds.
    """
    if stop_at is not None and stop_at not in POINTS:
        raise ValueError(f"stop_at: no such point: {stop_at!r}")
    env = {FAULT_ENV: stop_at} if stop_at is not None else {}
    if solve_delay is not None:
        env[TEST_SOLVE_DELAY_ENV] = str(solve_delay)
    if warm_delay is not None:
        env[TEST_WARM_DELAY_ENV] = str(warm_delay)
    return env


@contextmanager
def installed(
    points: Mapping[str, Callable[[], None]] | None = None,
    delays: Mapping[str, float] | None = None,
) -> Iterator[None]:
    """Hooks in this process for the length of the ``with`` block (see ``install``)."""
    install(points, delays)
    try:
        yield
    finally:
        uninstall()
