"""The solve worker: below the server's CPU priority, on the cores it is given.

``run_solve`` runs in a spawned process, as the server starts it; the test reads the worker's
niceness from ``/proc`` while it waits in its (test-only) partial phase, then lets a solve run to
the end with the default options (threads on every core of its affinity).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from perseus.schedules import one_f_one_b
from perseus_server.runtime.solve_worker import SOLVE_NICENESS, run_solve
from perseus_server.testing.fault_hooks import TEST_SOLVE_DELAY_ENV

ROOT = Path(__file__).resolve().parents[3]


def _profile(stages: int) -> str:
    lines = (ROOT / "profiles" / "gpt3-175b_a40_8stage.csv").read_text().splitlines()
    return "\n".join([lines[0]] + [x for x in lines[1:] if int(x.split(",")[0]) < stages])


def _niceness(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[16])


def _start(ctx, delay: float | None, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    if delay is None:
        monkeypatch.delenv(TEST_SOLVE_DELAY_ENV, raising=False)
    else:
        monkeypatch.setenv(TEST_SOLVE_DELAY_ENV, str(delay))  # a spawned child inherits it
    reader, writer = ctx.Pipe(duplex=False)
    cancel = ctx.Event()
    args = (_profile(4), one_f_one_b(4, 8).to_json(), 70.38, writer, cancel, None, True)
    proc = ctx.Process(target=run_solve, args=args, daemon=True)
    proc.start()
    writer.close()
    return proc, reader, cancel


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_worker_runs_below_the_servers_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its niceness is the server's plus ``SOLVE_NICENESS``; a cancel still ends it."""
    ctx = mp.get_context("spawn")
    proc, reader, cancel = _start(ctx, 60.0, monkeypatch)
    try:
        assert reader.poll(120), "no message from the worker"
        kind, *_ = reader.recv()
        while kind == "progress":
            kind, *_ = reader.recv()
        assert kind == "first"  # now waiting in its partial phase
        assert _niceness(proc.pid) == min(19, _niceness(os.getpid()) + SOLVE_NICENESS)
        cancel.set()
        msgs = []
        while True:
            try:
                msgs.append(reader.recv())
            except EOFError:
                break
        assert msgs[-1][0] == "cancelled"
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def test_a_solve_with_the_default_options_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every core of its affinity, the worker's frontier is the solver's own."""
    from perseus.frontier import Frontier
    from perseus.profiles import parse_profile_csv
    from perseus.solver import solve_frontier

    ctx = mp.get_context("spawn")
    proc, reader, _ = _start(ctx, None, monkeypatch)
    msgs = []
    while True:
        try:
            msgs.append(reader.recv())
        except EOFError:
            break
    proc.join(30)
    assert msgs[-1][0] == "done", msgs[-1]
    got = Frontier.from_json(json.loads(msgs[-1][1]))
    want = solve_frontier(parse_profile_csv(_profile(4)), one_f_one_b(4, 8), 70.38)
    assert got.times.tolist() == want.times.tolist()
    assert got.energies.tolist() == want.energies.tolist()
