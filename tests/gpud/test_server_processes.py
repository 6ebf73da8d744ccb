"""The node daemon with real processes.

An unprivileged trainer locks clocks through a ``perseus gpud --simulate`` subprocess, and whatever
happens to the trainer (SIGKILL, SIGSTOP) or to the daemon (SIGKILL and restart), no GPU stays
locked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpud_harness
import pytest
from gpud_harness import (
    NOBODY,
    NOGROUP,
    Daemon,
    Trainer,
    child_env,
    holder,
    wait_for,
    with_signal,
)

from perseus_client import DaemonGpu
from perseus_client.errors import GpudLeaseHeldError
from perseus_gpud.simnvml import SimulatedNvml, simulated_uuid

# The shared fixtures (see gpud_harness for why they are not in a conftest.py).
workdir = gpud_harness.workdir
start_daemon = gpud_harness.start_daemon
start_trainer = gpud_harness.start_trainer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon and drops to nobody"),
]

CLOCKS = (1200, 1005)
DAEMON_ARGS = ("--simulate", "2", "--allow-uid", str(NOBODY), "--group", "nogroup")


def held_by(daemon: Daemon, gpu: int, trainer: Trainer) -> dict[str, Any] | None:
    row = daemon.status()[gpu]
    holder = row["holder"]
    if holder is not None and holder["pid"] == trainer.pid and row["locked_mhz"] in CLOCKS:
        return row
    return None


def is_reset(daemon: Daemon, gpu: int) -> bool:
    row = daemon.status()[gpu]
    return row["holder"] is None and row["locked_mhz"] is None


def test_unprivileged_trainer_locks_through_the_daemon_which_sees_its_uid(
    start_daemon: Callable[..., Daemon], start_trainer: Callable[..., Trainer], workdir: Path
) -> None:
    daemon = start_daemon(*DAEMON_ARGS)
    trainer = start_trainer("t", daemon.socket, "--uid", str(NOBODY), "--gpu", "1")
    row = wait_for(lambda: held_by(daemon, 1, trainer), 20.0, "the trainer's lease")
    assert holder(row) == (trainer.pid, NOBODY)
    assert row["holder"]["owned_by"] == "device-node"  # it opened GPU 1's device node
    assert daemon.status()[0]["holder"] is None
    wait_for(lambda: trainer.iterations() >= 3, 20.0, "training iterations")
    first = trainer.progress.read_text().splitlines()[0].split()
    assert [int(first[1]), int(first[2])] == [trainer.pid, NOBODY]  # it really ran as nobody
    # The daemon logged the trainer's changes with its pid and uid.
    assert f"leased by pid {trainer.pid} uid {NOBODY} (device-node)" in daemon.log()
    # `gpud status --json`, the real command line.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "perseus_gpud",
            "status",
            "--socket",
            daemon.socket,
            "--json",
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=30,
        check=True,
    )
    rows = json.loads(out.stdout)
    assert [r["index"] for r in rows] == [0, 1]
    assert holder(rows[1]) == (trainer.pid, NOBODY)
    assert set(rows[0]) == {"index", "uuid", "name", "locked_mhz", "holder"}
    assert rows[1]["uuid"] == simulated_uuid(1)
    # A second client cannot lease the held GPU; the error names the holder's pid.
    daemon.own(1)
    with pytest.raises(GpudLeaseHeldError, match=rf"pid {trainer.pid}\b"):
        DaemonGpu(1, socket=daemon.socket, connect_timeout=1.0)


def test_sigkill_of_the_trainer_mid_iteration_resets_its_gpu(
    start_daemon: Callable[..., Daemon], start_trainer: Callable[..., Trainer], workdir: Path
) -> None:
    state = workdir / "state.json"
    daemon = start_daemon(*DAEMON_ARGS, "--simulate-state", str(state))
    trainer = start_trainer("t", daemon.socket, "--uid", str(NOBODY))
    wait_for(lambda: held_by(daemon, 0, trainer), 20.0, "the trainer's lease")
    wait_for(lambda: trainer.iterations() >= 2, 20.0, "training iterations")
    assert SimulatedNvml.read_state(state)["gpus"][0]["locked_mhz"] in CLOCKS
    os.kill(trainer.pid, signal.SIGKILL)
    wait_for(lambda: is_reset(daemon, 0), 10.0, "the GPU to be reset after the SIGKILL")
    assert SimulatedNvml.read_state(state)["gpus"][0]["locked_mhz"] is None  # NVML was reset
    # Seen as the connection closing or as the holder process gone, whichever came first.
    assert f"lease of pid {trainer.pid} uid {NOBODY} ended (" in daemon.log()


def test_a_stopped_trainer_loses_its_lease_a_busy_one_does_not(
    start_daemon: Callable[..., Daemon], start_trainer: Callable[..., Trainer]
) -> None:
    timeout = 1.0
    daemon = start_daemon(*DAEMON_ARGS, "--lease-timeout", str(timeout))
    trainer = start_trainer(
        "t",
        daemon.socket,
        "--uid",
        str(NOBODY),
        "--hang-at",
        "2",
        "--hang-seconds",
        str(3 * timeout),
    )
    wait_for(lambda: held_by(daemon, 0, trainer), 20.0, "the trainer's lease")
    # Busy: the training thread sits in one instruction for 3 lease timeouts; the heartbeat
    # thread keeps the lease.
    wait_for(lambda: trainer.iterations() >= 2, 20.0, "the trainer to reach its long instruction")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2 * timeout:
        assert holder(daemon.status()[0]) == (trainer.pid, NOBODY)
        time.sleep(0.1)
    # Stopped: nothing runs, the lease times out and the GPU is reset.
    with_signal(trainer.proc, signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: is_reset(daemon, 0), 10.0, "the stopped trainer's GPU to be reset")
    assert time.monotonic() - stopped >= 0.8 * timeout
    assert "lease timeout" in daemon.log()
    # Continued: the trainer notices, re-leases and trains on.
    with_signal(trainer.proc, signal.SIGCONT)
    wait_for(lambda: held_by(daemon, 0, trainer), 20.0, "the resumed trainer's new lease")
    done = trainer.iterations()
    wait_for(lambda: trainer.iterations() > done, 20.0, "training after SIGCONT")


def test_a_uid_not_allowed_is_refused(
    start_daemon: Callable[..., Daemon], start_trainer: Callable[..., Trainer]
) -> None:
    daemon = start_daemon(*DAEMON_ARGS)
    # In the socket's group (so it may connect) but neither an allowed uid nor gid.
    trainer = start_trainer("t", daemon.socket, "--uid", "12345", "--gid", str(NOGROUP))
    assert trainer.proc.wait(timeout=30) == 3
    assert "PERMISSION_DENIED" in trainer.log() and "uid 12345" in trainer.log()
    assert "refused lease from pid" in daemon.log() and "uid 12345" in daemon.log()
    assert daemon.status()[0]["holder"] is None


def test_daemon_killed_and_restarted_resets_what_it_locked_and_the_trainer_leases_again(
    start_daemon: Callable[..., Daemon], start_trainer: Callable[..., Trainer], workdir: Path
) -> None:
    state = workdir / "state.json"
    daemon = start_daemon(*DAEMON_ARGS, "--simulate-state", str(state))
    trainer = start_trainer("t", daemon.socket, "--uid", str(NOBODY), "--clocks", "1005")
    wait_for(lambda: held_by(daemon, 0, trainer), 20.0, "the trainer's lease")
    daemon.kill()
    # The crash left the GPU locked (as NVML would), and training goes on without the daemon.
    gpus = SimulatedNvml.read_state(state)["gpus"]
    assert gpus[0]["locked_mhz"] == 1005
    resets_before = gpus[0]["resets"]
    # Meanwhile another tool (nvidia-smi -lgc, DCGM) locks GPU 1: the daemon must leave it.
    gpus[1]["locked_mhz"] = 1200
    state.write_text(json.dumps({"gpus": gpus}))
    during = trainer.iterations()
    wait_for(lambda: trainer.iterations() >= during + 3, 20.0, "training while the daemon is down")
    wait_for(lambda: "lost the node daemon" in trainer.log(), 10.0, "the trainer's warning")

    restarted = Daemon(workdir, daemon.args).start()
    try:
        wait_for(lambda: held_by(restarted, 0, trainer), 20.0, "the trainer's new lease")
        assert restarted.status()[0]["locked_mhz"] == 1005  # the trainer's clock, applied again
        assert (
            "reset GPU 0 (" in restarted.log() and "left it locked at 1005 MHz" in restarted.log()
        )
        assert "reset GPU 1" not in restarted.log()
        assert restarted.status()[1]["locked_mhz"] is None  # not gpud's lock: not in its status
        assert SimulatedNvml.read_state(state)["gpus"][1]["locked_mhz"] == 1200  # left alone
        assert SimulatedNvml.read_state(state)["gpus"][0]["resets"] > resets_before
        after = trainer.iterations()
        wait_for(lambda: trainer.iterations() > after, 20.0, "training after the restart")
        log = trainer.log()
        assert log.count("lost the node daemon") == 1  # logged once, not per retry
        assert log.count("the node daemon is back") == 1
        assert trainer.proc.poll() is None
    finally:
        restarted.kill()
