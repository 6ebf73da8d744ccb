"""The solver's kernels compiled (or loaded from numba's cache) when the server starts.

numba compiles a kernel on its first call and caches the result on disk; a solve worker that
finds no cache compiles them all first (tens of seconds). At start the server runs
``python -m perseus.kernels.warm`` in a child process (the server process itself never imports
numba) and holds solves ``queued`` until it has ended, so the first solve finds every kernel in
the cache. Meanwhile the server answers everything else, so ``GET /healthz`` stays ``ok``
(HTTP 200: a load balancer that took the server out would only drop plan pushes and reports it
can serve) and says ``"kernels": "warming"``; a check that wants solves to start at once waits
for ``ready``. A warm-up that fails or runs past its time limit is logged and solves
go ahead (each worker then compiles what it lacks).

Set ``PERSEUS_WARM_KERNELS=0`` to skip it (an image whose build step already warmed the cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from enum import StrEnum

from perseus_server.runtime.faults import TEST_WARM_DELAY_ENV, test_delay
from perseus_server.runtime.solve_manager import SolveManager

__all__ = ["KernelState", "WARM_ENV", "WARM_SECONDS", "warm_kernels"]

log = logging.getLogger("perseus.server")

#: ``0`` skips the warm-up.
WARM_ENV = "PERSEUS_WARM_KERNELS"
#: The warm-up's time limit (a cold compile of every kernel takes well under it).
WARM_SECONDS = 600.0


class KernelState(StrEnum):
    """The solver kernels as ``GET /healthz`` ``kernels`` reports them."""

    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"
    SKIPPED = "skipped"


def warm_kernels(solver: SolveManager) -> asyncio.Task[None] | None:
    """Start the warm-up on the running loop (None when ``PERSEUS_WARM_KERNELS=0``).

    Solves on ``solver`` wait for it and ``solver.kernels`` follows its state.
    """
    if os.environ.get(WARM_ENV, "1").strip() == "0":
        solver.kernels = KernelState.SKIPPED
        return None
    solver.kernels = KernelState.WARMING
    task = asyncio.get_running_loop().create_task(_warm(solver), name="perseus-kernel-warmup")
    solver.hold_until(task)
    return task


async def _warm(solver: SolveManager) -> None:
    proc: asyncio.subprocess.Process | None = None
    try:
        delay = test_delay(TEST_WARM_DELAY_ENV)
        if delay:
            await asyncio.sleep(delay)
        t0 = time.monotonic()
        proc = await _spawn(sys.executable, "-m", "perseus.kernels.warm")
        out, _ = await asyncio.wait_for(proc.communicate(), WARM_SECONDS)
        text = out.decode(errors="replace").strip()
        if proc.returncode == 0:
            solver.kernels = KernelState.READY
            log.info("solver kernels warm in %.1f s: %s", time.monotonic() - t0, text[-300:])
        else:
            solver.kernels = KernelState.FAILED
            log.warning("warming the solver kernels failed (%s): %s", proc.returncode, text[-500:])
    except TimeoutError:
        solver.kernels = KernelState.FAILED
        log.warning("warming the solver kernels took over %g s; stopped", WARM_SECONDS)
    except OSError as e:
        solver.kernels = KernelState.FAILED
        log.warning("cannot warm the solver kernels: %s", e)
    finally:
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())


async def _spawn(*argv: str) -> asyncio.subprocess.Process:
    """Start ``argv`` (its output piped); cancelled meanwhile, the process is still returned.

    A task cancelled inside ``create_subprocess_exec`` leaves asyncio waiting for a child it
    never hands back (the server then never exits); so the spawn runs to its end, and the
    cancellation is raised after it, with the process killed by the caller's cleanup.
    """
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    )
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        proc = await spawn
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
