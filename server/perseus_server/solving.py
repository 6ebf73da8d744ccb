"""Frontier computations in worker processes: started, watched, cancelled, and reported back.

Each solve runs in its own spawned process (a crash or a kill of one never affects the server
or another solve); at most ``max_concurrent`` run at once, the others wait ``queued``. The
server's event loop polls the worker's queue, so it is never blocked by a solve.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import queue as queue_mod
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perseus_server.solve_worker import run_solve

__all__ = ["SolveEvents", "SolveManager"]


@dataclass(frozen=True)
class SolveEvents:
    """Callbacks (run on the event loop) for one solve."""

    on_running: Callable[[int], None]
    on_progress: Callable[[float], None]
    on_done: Callable[[str, float], None]
    on_failed: Callable[[str], None]


@dataclass
class _Solve:
    cancel: Any
    task: asyncio.Task[None] | None = None
    process: Any = None
    reason: str = field(default="")


class SolveManager:
    """Runs frontier computations in spawned worker processes."""

    def __init__(self, max_concurrent: int, poll_interval: float = 0.05) -> None:
        self._ctx = mp.get_context("spawn")
        self._sem = asyncio.Semaphore(max_concurrent)
        self._poll = poll_interval
        self._solves: dict[str, _Solve] = {}

    def is_active(self, job_id: str) -> bool:
        return job_id in self._solves

    def worker_pid(self, job_id: str) -> int | None:
        s = self._solves.get(job_id)
        return None if s is None or s.process is None else s.process.pid

    def start(
        self,
        job_id: str,
        profile_csv: str,
        schedule_json: dict[str, Any],
        blocking_power: float,
        events: SolveEvents,
    ) -> None:
        if job_id in self._solves:
            raise RuntimeError(f"job {job_id} is already solving")
        solve = _Solve(cancel=self._ctx.Event())
        self._solves[job_id] = solve
        solve.task = asyncio.get_running_loop().create_task(
            self._run(job_id, solve, profile_csv, schedule_json, blocking_power, events)
        )

    def cancel(self, job_id: str, reason: str = "cancelled by request") -> bool:
        """Ask the solve to stop; its ``on_failed`` callback fires with ``reason``."""
        s = self._solves.get(job_id)
        if s is None:
            return False
        s.reason = reason
        s.cancel.set()
        return True

    async def shutdown(self) -> None:
        """Stop every solve (their jobs are marked failed by the callbacks)."""
        for job_id in list(self._solves):
            self.cancel(job_id, "the server shut down during the computation")
        tasks = [s.task for s in self._solves.values() if s.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        for s in list(self._solves.values()):
            if s.process is not None and s.process.is_alive():
                s.process.kill()

    async def _run(
        self,
        job_id: str,
        solve: _Solve,
        profile_csv: str,
        schedule_json: dict[str, Any],
        blocking_power: float,
        events: SolveEvents,
    ) -> None:
        outcome: tuple[str, Any, Any] = ("failed", "internal error", None)
        try:
            async with self._sem:
                if solve.cancel.is_set():
                    outcome = ("failed", solve.reason, None)
                else:
                    q = self._ctx.Queue()
                    proc = self._ctx.Process(
                        target=run_solve,
                        args=(profile_csv, schedule_json, blocking_power, q, solve.cancel),
                        name=f"perseus-solve-{job_id}",
                        daemon=True,
                    )
                    proc.start()
                    solve.process = proc
                    events.on_running(proc.pid or 0)
                    outcome = await self._watch(solve, proc, q, events)
                    await asyncio.get_running_loop().run_in_executor(None, proc.join, 5.0)
                    if proc.is_alive():
                        proc.kill()
                    q.close()
        except Exception as e:  # noqa: BLE001 - the job must learn why
            outcome = ("failed", f"internal error while supervising the solve: {e}", None)
        finally:
            self._solves.pop(job_id, None)
        # Report only once the solve is gone, so a new one can start from the callback on.
        if outcome[0] == "done":
            seconds = outcome[2]
            assert seconds is not None  # a done solve reports its time
            events.on_done(outcome[1], float(seconds))
        else:
            events.on_failed(str(outcome[1]))

    async def _watch(
        self, solve: _Solve, proc: Any, q: Any, events: SolveEvents
    ) -> tuple[str, Any, Any]:
        cancel_deadline: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            msg = _drain(q, events)
            if msg is not None:
                kind = msg[0]
                if kind == "done":
                    return ("done", msg[1], msg[2])
                if kind == "cancelled":
                    return ("failed", solve.reason or str(msg[1]), None)
                return ("failed", str(msg[1]), None)
            if not proc.is_alive():
                msg = _drain(q, events)
                if msg is None:
                    code = proc.exitcode
                    why = f"exited with status {code}"
                    if code is not None and code < 0:
                        with contextlib.suppress(ValueError):
                            why = f"killed by signal {signal.Signals(-code).name}"
                    if solve.cancel.is_set() and solve.reason:
                        return ("failed", solve.reason, None)
                    return ("failed", f"the solver process died ({why})", None)
                continue
            if solve.cancel.is_set():
                now = loop.time()
                if cancel_deadline is None:
                    cancel_deadline = now + 3.0
                elif now > cancel_deadline:
                    proc.terminate()
                    cancel_deadline = now + 3.0
            await asyncio.sleep(self._poll)


def _drain(q: Any, events: SolveEvents) -> tuple[Any, ...] | None:
    """Deliver queued progress messages; return the first final message, if any."""
    while True:
        try:
            msg = q.get_nowait()
        except queue_mod.Empty:
            return None
        except (EOFError, OSError):
            return None
        if msg[0] == "progress":
            events.on_progress(float(msg[1]))
            continue
        return tuple(msg)
