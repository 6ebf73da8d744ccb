"""The body of a frontier computation, run in a separate (spawned) process.

Kept free of the web stack so the worker imports only numpy/scipy and the Perseus core.
Messages sent on ``conn`` (the write end of a one-way pipe): ``("progress", fraction)``, at most
one ``("first", frontier_json)`` (with ``first_plan``: the solver's verified zero-slowdown plan
as a frontier of one point, sent before the bulk of the work), then one of
``("done", frontier_json, seconds)``, ``("cancelled", reason)`` or ``("error", reason)``.
Once the solver is imported, the worker's address space is capped at what it uses plus its
memory budget, so an allocation beyond the budget fails here (``MemoryError``) at once.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from typing import Any

from perseus_server.runtime.faults import TEST_SOLVE_DELAY_ENV, test_delay

__all__ = ["run_solve"]


def _exit_with_parent(parent: Any) -> None:
    """Exit as soon as the server that started us is gone.

    Killed outright, the server cannot cancel us, and nothing would read our results: flushing
    them could block exit forever. Waits on the parent's sentinel, so a parent that died before
    we started is noticed too.
    """
    parent.join()
    os._exit(1)


def _cap_address_space(budget: int) -> None:
    """RLIMIT_AS = what the process maps now + ``budget`` (soft limit; the hard one is kept)."""
    try:
        import resource

        with open("/proc/self/statm", "rb") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = mapped + budget
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (ImportError, OSError, ValueError):
        pass  # not Linux: the parent's resident-set polling still enforces the budget


def run_solve(
    profile_csv: str,
    schedule_json: dict[str, Any],
    blocking_power: float,
    conn: Any,
    cancel: Any,
    memory_bytes: int | None = None,
    first_plan: bool = False,
) -> None:
    """Solve and report through ``conn``.

    ``cancel`` is a multiprocessing Event; with ``first_plan``, the early zero-slowdown plan is
    sent as soon as the solver has it.
    """
    from perseus.errors import PerseusError, SolverCancelled
    from perseus.frontier import Frontier
    from perseus.profiles import parse_profile_csv
    from perseus.schedules import Schedule
    from perseus.solver import SolverOptions, solve_frontier

    if memory_bytes is not None:
        _cap_address_space(memory_bytes)
    lock = threading.Lock()

    def send(msg: tuple[Any, ...]) -> None:
        with lock:
            conn.send(msg)

    last = [-1.0, 0.0]
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()

    def progress(fraction: float) -> None:
        now = time.monotonic()
        if fraction - last[0] >= 0.01 or now - last[1] >= 0.25 or fraction >= 1.0:
            last[0], last[1] = fraction, now
            send(("progress", float(fraction)))

    def on_first_plan(early: Frontier) -> None:
        send(("first", json.dumps(early.to_json(compact=True))))
        deadline = time.monotonic() + test_delay(TEST_SOLVE_DELAY_ENV)
        while time.monotonic() < deadline:  # test-only: a partial phase long enough to watch
            if cancel.wait(0.05):
                raise SolverCancelled("frontier computation cancelled")

    try:
        if cancel.is_set():
            raise SolverCancelled("frontier computation cancelled")
        t0 = time.perf_counter()
        profile = parse_profile_csv(profile_csv)
        schedule = Schedule.from_json(schedule_json)
        frontier = solve_frontier(
            profile,
            schedule,
            blocking_power,
            progress=progress,
            cancel=cancel.is_set,
            on_first_plan=on_first_plan if first_plan else None,
            options=SolverOptions(workers=1),  # one core per solve: the server runs several
        )
        send(("done", json.dumps(frontier.to_json(compact=True)), time.perf_counter() - t0))
    except SolverCancelled as e:
        send(("cancelled", str(e) or "cancelled"))
    except PerseusError as e:
        send(("error", f"{type(e).__name__}: {e}"))
    except MemoryError:
        budget = "" if memory_bytes is None else f" of {memory_bytes // 2**20} MiB"
        send(("error", f"the computation exceeded its memory budget{budget} (solve memory limit)"))
    except Exception as e:  # noqa: BLE001 - any solver bug must reach the job as a failure reason
        send(("error", f"solver error: {type(e).__name__}: {e}"))
    finally:
        conn.close()
