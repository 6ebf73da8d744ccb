"""Frontier computations in worker processes: started, watched, cancelled, and reported back.

Each solve runs in its own spawned process (a crash or a kill of one never affects the server
or another solve); at most ``max_concurrent`` run at once, the others wait ``queued`` (at most
``max_queued``, one per key; a tenant at most its share of them, :meth:`SolveManager.queue_full`).
A slot that frees goes to the tenants in turn, each tenant's solves first come first served
(:mod:`perseus_server.runtime.fair_slots`): one tenant's backlog never holds another's solve
back for more than one slot's release. Every worker has a memory budget (its resident set, polled, and an
address-space limit set in the worker) and a time limit; a solve over either fails with a reason
naming the limit, and the others go on.

Results come back over a one-way pipe whose write end the parent closes once the worker has
started, read by a thread: a worker that dies halfway through a message makes that read end
(EOF) instead of blocking anything, and the event loop never reads the pipe itself. The
``prepare`` callback (decoding a frontier) runs on that thread too, off the loop.

The first plan: a solve whose events take ``on_first_plan`` sends the solver's early
zero-slowdown plan (a frontier of one point) before the bulk of the work. It is handed on once
the solve has gone on for ``first_plan_after`` seconds since and is neither done nor cancelled:
a solve that ends sooner reports only its whole frontier (its ranks get one new plan, not two
in quick succession).

Warming: :meth:`SolveManager.hold_until` makes solves wait (``queued``) until a task ends (the
server's kernel warm-up at start), so no worker compiles the kernels a warm-up is compiling.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from perseus_server.runtime.fair_slots import FairSlots
from perseus_server.runtime.solve_worker import run_solve

__all__ = ["SolveEvents", "SolveLimits", "SolveManager", "rss_bytes"]


@dataclass(frozen=True)
class SolveLimits:
    """Per-solve bounds on memory, time and queue, and how long a first plan waits.

    ``memory_bytes`` of resident memory, ``seconds`` of wall time, and ``max_queued`` solves
    waiting for a worker slot (``start`` refuses more); and how long a first plan waits before
    it is handed on (``first_plan_after``, see the module docstring).
    """

    memory_bytes: int = 8 * 1024**3
    seconds: float = 3600.0
    max_queued: int = 64
    #: Seconds a solve must still be running after its first plan for that plan to be used.
    first_plan_after: float = 1.0


@dataclass(frozen=True)
class SolveEvents:
    """Callbacks (run on the event loop) for one solve.

    ``prepare`` runs on a worker thread with the result document before ``on_done`` gets both.
    With ``on_first_plan``, the worker sends its first plan too, and ``on_first_plan`` gets its
    document and what ``prepare`` made of it (at most once, before ``on_done``/``on_failed``;
    never after a cancel).
    """

    on_running: Callable[[int], None]
    on_progress: Callable[[float], None]
    on_done: Callable[[str, float, Any], None]
    on_failed: Callable[[str], None]
    prepare: Callable[[str], Any] = field(default=lambda doc: None)
    on_first_plan: Callable[[str, Any], None] | None = None


@dataclass
class _Solve:
    cancel: Any
    task: asyncio.Task[None] | None = None
    process: Any = None
    reason: str = field(default="")
    running: bool = False
    first: asyncio.TimerHandle | None = None  # the pending hand-over of the first plan
    ended: bool = False  # the final message has arrived
    tenant: str = "default"  # whose solve it is (served in turn with the other tenants')


def rss_bytes(pid: int) -> int | None:
    """Resident set size of process ``pid`` (Linux ``/proc``; None when unknown)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _read_all(
    conn: Any,
    events: SolveEvents,
    loop: asyncio.AbstractEventLoop,
    on_first: Callable[[str, Any], None] | None = None,
) -> tuple[Any, ...]:
    """Thread body: read messages until a final one or EOF.

    Progress and the first plan (made ready by ``prepare`` here) go to the loop.
    """
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "progress":
                loop.call_soon_threadsafe(events.on_progress, float(msg[1]))
                continue
            if msg[0] == "first":
                if on_first is None:
                    continue
                try:
                    prepared = events.prepare(msg[1])
                except Exception:  # noqa: BLE001 - an unreadable first plan is not used
                    continue
                loop.call_soon_threadsafe(on_first, msg[1], prepared)
                continue
            if msg[0] == "done":
                try:
                    prepared = events.prepare(msg[1])
                except Exception as e:  # noqa: BLE001 - an unreadable result fails the job
                    return ("error", f"the solver returned an unreadable frontier: {e}")
                return ("done", msg[1], msg[2], prepared)
            return tuple(msg)
    except (EOFError, OSError):
        return ("eof",)
    finally:
        with contextlib.suppress(OSError):
            conn.close()


def _reader_thread(
    conn: Any, events: SolveEvents, name: str, on_first: Callable[[str, Any], None]
) -> asyncio.Future[tuple[Any, ...]]:
    """Read ``conn`` on a thread of its own; the future resolves with the final message.

    A solve holds the thread for its whole run, so the loop's shared executor is never tied up.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[tuple[Any, ...]] = loop.create_future()

    def deliver(msg: tuple[Any, ...]) -> None:
        if not fut.done():
            fut.set_result(msg)

    def run() -> None:
        msg = _read_all(conn, events, loop, on_first)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(deliver, msg)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


class SolveManager:
    """Runs frontier computations in spawned worker processes."""

    def __init__(
        self,
        max_concurrent: int,
        poll_interval: float = 0.05,
        limits: SolveLimits | None = None,
    ) -> None:
        self._ctx = mp.get_context("spawn")
        self._slots = FairSlots(max_concurrent)
        self._poll = poll_interval
        self._solves: dict[str, _Solve] = {}
        self.limits = limits or SolveLimits()
        self._hold: asyncio.Future[Any] | None = None
        #: Set by :meth:`shutdown`: solves that fail from now on were stopped with the server.
        self.stopping = False
        #: The kernels' warm-up state (see :mod:`perseus_server.runtime.warmup`; ``skipped``: none ran).
        self.kernels: str = "skipped"

    def hold_until(self, task: asyncio.Future[Any]) -> None:
        """Let no worker start before ``task`` ends (however it ends)."""
        self._hold = task

    @property
    def holding(self) -> bool:
        """Whether solves are held back (see :meth:`hold_until`)."""
        return self._hold is not None and not self._hold.done()

    def is_active(self, job_id: str) -> bool:
        """Whether job ``job_id`` has a solve queued or running."""
        return job_id in self._solves

    def queued(self) -> int:
        """Solves waiting for a worker slot."""
        return sum(1 for s in self._solves.values() if not s.running)

    def queued_of(self, tenant: str) -> int:
        """Solves of ``tenant`` waiting for a worker slot."""
        return sum(1 for s in self._solves.values() if not s.running and s.tenant == tenant)

    def queue_full(self, tenant: str | None = None, share: int | None = None) -> bool:
        """Whether a new solve must wait no more.

        ``max_queued`` solves already wait, or, with ``tenant``, it has ``share`` waiting
        (its share of ``max_queued``: the shares sum to it at most, so no tenant's backlog
        refuses another's solve).
        """
        if tenant is not None and share is not None:
            return self.queued_of(tenant) >= share
        return self.queued() >= self.limits.max_queued

    def worker_pid(self, job_id: str) -> int | None:
        """The process id of the job's solve worker, or None when none runs."""
        s = self._solves.get(job_id)
        return None if s is None or s.process is None else s.process.pid

    def start(
        self,
        job_id: str,
        profile_csv: str,
        schedule_json: dict[str, Any],
        blocking_power: float,
        events: SolveEvents,
        tenant: str = "default",
    ) -> None:
        """Queue a solve of the job's profile and schedule; ``events`` hears how it goes.

        ``tenant``: whose it is (worker slots go to the tenants in turn). Raises
        ``RuntimeError`` when the job is solving already.
        """
        if job_id in self._solves:
            raise RuntimeError(f"job {job_id} is already solving")
        solve = _Solve(cancel=self._ctx.Event(), tenant=tenant)
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
        """Stop every solve (their ``on_failed`` callbacks run; :attr:`stopping` is set)."""
        self.stopping = True
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
        outcome: tuple[Any, ...] = ("failed", "internal error", None)
        try:
            while self._hold is not None and not self._hold.done() and not solve.cancel.is_set():
                await asyncio.wait({self._hold}, timeout=self._poll)  # held: stays queued
            async with self._slot(solve):
                if solve.cancel.is_set():
                    outcome = ("failed", solve.reason, None)
                else:
                    solve.running = True
                    reader, writer = self._ctx.Pipe(duplex=False)
                    proc = self._ctx.Process(
                        target=run_solve,
                        args=(
                            profile_csv,
                            schedule_json,
                            blocking_power,
                            writer,
                            solve.cancel,
                            self.limits.memory_bytes,
                            events.on_first_plan is not None,
                        ),
                        name=f"perseus-solve-{job_id}",
                        daemon=True,
                    )
                    try:
                        proc.start()
                    finally:
                        writer.close()  # only the worker writes: its death ends our reads
                    solve.process = proc
                    events.on_running(proc.pid or 0)
                    result = _reader_thread(
                        reader,
                        events,
                        f"perseus-solve-reader-{job_id}",
                        lambda doc, prepared: self._first_arrived(solve, events, doc, prepared),
                    )
                    outcome = await self._watch(solve, proc, result)
                    solve.ended = True
                    if solve.first is not None:
                        solve.first.cancel()
                    await asyncio.to_thread(proc.join, 5.0)
                    if proc.is_alive():
                        proc.kill()
                        await asyncio.to_thread(proc.join, 5.0)

        except Exception as e:  # noqa: BLE001 - the job must learn why
            outcome = ("failed", f"internal error while supervising the solve: {e}", None)
        finally:
            self._solves.pop(job_id, None)
        # Report only once the solve is gone, so a new one can start from the callback on.
        if outcome[0] == "done":
            seconds = outcome[2]
            assert seconds is not None  # a done solve reports its time
            events.on_done(outcome[1], float(seconds), outcome[3] if len(outcome) > 3 else None)
        else:
            events.on_failed(str(outcome[1]))

    @contextlib.asynccontextmanager
    async def _slot(self, solve: _Solve) -> AsyncIterator[None]:
        """Hold a worker slot for ``solve`` (given in turn); a cancel stops the wait."""
        slot = self._slots.acquire(solve.tenant)
        try:
            while not slot.done() and not solve.cancel.is_set():
                await asyncio.wait({slot}, timeout=self._poll)
            yield
        finally:
            self._slots.withdraw(solve.tenant, slot)  # a slot held is released

    def _first_arrived(self, solve: _Solve, events: SolveEvents, doc: str, prepared: Any) -> None:
        """The first plan is here: hand it on in ``first_plan_after`` s.

        Unless the solve has ended or been cancelled by then.
        """
        on_first = events.on_first_plan
        if on_first is None or solve.ended or solve.cancel.is_set():
            return

        def hand_on() -> None:
            solve.first = None
            if not solve.ended and not solve.cancel.is_set():
                on_first(doc, prepared)

        solve.first = asyncio.get_running_loop().call_later(self.limits.first_plan_after, hand_on)

    async def _watch(
        self, solve: _Solve, proc: Any, result: asyncio.Future[tuple[Any, ...]]
    ) -> tuple[Any, ...]:
        cancel_deadline: float | None = None
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        limits = self.limits
        over: str | None = None
        while True:
            if result.done():
                msg = result.result()
                kind = msg[0]
                if kind == "done":
                    return msg
                if kind == "cancelled":
                    return ("failed", over or solve.reason or str(msg[1]), None)
                if kind == "error":
                    return ("failed", over or str(msg[1]), None)
                # EOF: the worker exited (or died) without a final message.
                await asyncio.to_thread(proc.join, 5.0)
                code = proc.exitcode
                why = f"exited with status {code}"
                if code is not None and code < 0:
                    with contextlib.suppress(ValueError):
                        why = f"killed by signal {signal.Signals(-code).name}"
                if over is not None:
                    return ("failed", over, None)
                if solve.cancel.is_set() and solve.reason:
                    return ("failed", solve.reason, None)
                return ("failed", f"the solver process died ({why})", None)
            if over is None and proc.pid is not None:
                rss = rss_bytes(proc.pid)
                if rss is not None and rss > limits.memory_bytes:
                    over = (
                        f"the computation exceeded its memory budget of "
                        f"{limits.memory_bytes // 2**20} MiB (solve memory limit)"
                    )
                    proc.kill()
                elif time.monotonic() - started > limits.seconds:
                    over = (
                        f"the computation exceeded its time limit of {limits.seconds:g} s "
                        "(solve time limit)"
                    )
                    solve.cancel.set()
                    cancel_deadline = loop.time() + 3.0
            if solve.cancel.is_set():
                now = loop.time()
                if cancel_deadline is None:
                    cancel_deadline = now + 3.0
                elif now > cancel_deadline:
                    proc.kill() if over is not None else proc.terminate()
                    cancel_deadline = now + 3.0
            await asyncio.wait({result}, timeout=self._poll)
