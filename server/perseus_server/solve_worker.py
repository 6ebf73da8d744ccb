"""The body of a frontier computation, run in a separate (spawned) process.

Kept free of the web stack so the worker imports only numpy/scipy and the Perseus core.
Messages put on ``queue``: ``("progress", fraction)``, then one of ``("done", frontier_json,
seconds)``, ``("cancelled", reason)`` or ``("error", reason)``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from typing import Any

__all__ = ["run_solve"]


def _exit_with_parent(parent: Any) -> None:
    """Exit as soon as the server that started us is gone (killed outright, it cannot cancel
    us, and nothing would read our results: flushing them could block exit forever). Waits on
    the parent's sentinel, so a parent that died before we started is noticed too."""
    parent.join()
    os._exit(1)


def run_solve(
    profile_csv: str, schedule_json: dict[str, Any], blocking_power: float, queue: Any, cancel: Any
) -> None:
    """Solve and report through ``queue``; ``cancel`` is a multiprocessing Event."""
    from perseus.errors import PerseusError, SolverCancelled
    from perseus.profiles import parse_profile_csv
    from perseus.schedules import Schedule
    from perseus.solver import solve_frontier

    last = [-1.0, 0.0]
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()

    def progress(fraction: float) -> None:
        now = time.monotonic()
        if fraction - last[0] >= 0.01 or now - last[1] >= 0.25 or fraction >= 1.0:
            last[0], last[1] = fraction, now
            queue.put(("progress", float(fraction)))

    try:
        if cancel.is_set():
            raise SolverCancelled("frontier computation cancelled")
        t0 = time.perf_counter()
        profile = parse_profile_csv(profile_csv)
        schedule = Schedule.from_json(schedule_json)
        frontier = solve_frontier(
            profile, schedule, blocking_power, progress=progress, cancel=cancel.is_set
        )
        queue.put(("done", json.dumps(frontier.to_json(compact=True)), time.perf_counter() - t0))
    except SolverCancelled as e:
        queue.put(("cancelled", str(e) or "cancelled"))
    except PerseusError as e:
        queue.put(("error", f"{type(e).__name__}: {e}"))
    except MemoryError:
        queue.put(("error", "the solver ran out of memory"))
    except Exception as e:  # noqa: BLE001 - any solver bug must reach the job as a failure reason
        queue.put(("error", f"solver error: {type(e).__name__}: {e}"))
