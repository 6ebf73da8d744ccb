"""The solver kernels' warm-up at the server's start (``runtime/warmup.py``).

Its states and the hold it puts on solves, on a real :class:`SolveManager`; a warm-up cancelled
while it spawns its child. A server's first solve after a warm-up is
``tests/server/runtime/test_solve_manager_resumed.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perseus_server.runtime.faults import TEST_WARM_DELAY_ENV
from perseus_server.runtime.solve_manager import SolveManager
from perseus_server.runtime.warmup import WARM_ENV, KernelState, warm_kernels

ROOT = Path(__file__).resolve().parents[3]


def test_warm_kernels_0_skips_the_warm_up_and_holds_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WARM_ENV, " 0 ")
    solver = SolveManager(1)

    async def run() -> asyncio.Task[None] | None:
        return warm_kernels(solver)

    assert asyncio.run(run()) is None
    assert solver.kernels == KernelState.SKIPPED == "skipped" and not solver.holding


def test_solves_are_held_while_the_kernels_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WARM_ENV, "1")
    monkeypatch.setenv(TEST_WARM_DELAY_ENV, "600")  # the warm-up waits before it spawns
    solver = SolveManager(1)

    async def run() -> None:
        task = warm_kernels(solver)
        assert task is not None and solver.kernels == KernelState.WARMING
        await asyncio.sleep(0)
        assert solver.holding
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not solver.holding  # however it ends, solves go ahead

    asyncio.run(run())


def test_a_warm_up_cancelled_while_it_spawns_lets_the_loop_end() -> None:
    # Cancelled right after it began spawning (one loop step): asyncio.run returns, the child
    # killed (left to run its ten minutes out, the subprocess would time out).
    script = textwrap.dedent(
        """
        import asyncio, sys
        from perseus_server.runtime.warmup import _spawn

        async def main():
            task = asyncio.create_task(_spawn(sys.executable, "-c", "import time; time.sleep(600)"))
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                print("cancelled")

        asyncio.run(main())
        print("ended")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["cancelled", "ended"]
