"""Power floors through the node daemon, for trainers without privileges.

A real ``perseus gpud --simulate 1 --simulate-smoothing`` (the simulated NVML with nvidia-ml-py's
power-smoothing calls, root only like NVML's) holds the floor an unprivileged peer asks for on
the GPU it leases, with the ramp rates, and releases it when the lease ends, however it ends
(SIGKILL included). Without power smoothing, or read-only, the lease says why no floor is held.
The simulated GPUs' state file is what a driver would have been told.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpud_harness
import pynvml
import pytest
from gpud_harness import NOBODY, NOGROUP, Daemon, PeerProcess, wait_for

from perseus_client import DaemonGpu

start_daemon = gpud_harness.start_daemon
start_peer = gpud_harness.start_peer
workdir = gpud_harness.workdir

FLOOR = pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR
UP = pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE
DOWN = pynvml.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE


def _smoothing(state: Path) -> dict[str, Any]:
    doc = json.loads(state.read_text())
    return dict(doc["gpus"][0]["smoothing"])


def _daemon(start: Callable[..., Daemon], workdir: Path, *extra: str) -> tuple[Daemon, Path]:
    state = workdir / "sim.json"
    daemon = start(
        "--simulate", "1", "--simulate-state", str(state), "--ownership", "none",
        "--allow-uid", str(NOBODY), "--group", "nogroup", *extra,
    )  # fmt: skip
    return daemon, state


def test_an_unprivileged_peer_holds_a_floor_released_when_it_is_killed(
    start_daemon: Callable[..., Daemon],
    start_peer: Callable[..., PeerProcess],
    workdir: Path,
) -> None:
    daemon, state = _daemon(start_daemon, workdir, "--simulate-smoothing")
    peer = start_peer(daemon.socket, "--uid", str(NOBODY), "--gid", str(NOGROUP))
    assert peer.cmd("lease 0")["ok"]
    held = peer.cmd("floor 100 1500")
    assert held == {"applied": True, "watts": 100.0, "unavailable": ""}
    sm = _smoothing(state)
    assert sm["enabled"] and sm["active"] == 0 and sm["floor_w"] == pytest.approx(100.0)
    assert sm["params"][f"0:{FLOOR}"] == pytest.approx(25.0)  # of the 400 W limit
    assert sm["params"][f"0:{UP}"] == sm["params"][f"0:{DOWN}"] == 1500.0
    # Only the holder may: a second peer cannot lease it, so cannot set a floor either.
    other = start_peer(daemon.socket, "--uid", str(NOBODY), "--gid", str(NOGROUP))
    assert other.cmd("lease 0")["code"] == "LEASE_HELD"
    # Out of range: refused, naming the field; the floor stays.
    bad = peer.cmd("floor 900 0")
    assert bad["code"] == "INVALID_ARGUMENT" and "set_power_floor.watts" in bad["message"]
    assert _smoothing(state)["floor_w"] == pytest.approx(100.0)
    peer.kill()  # SIGKILL: the daemon sees the connection drop and releases the floor
    wait_for(lambda: _smoothing(state)["floor_w"] == 0.0, 10.0, "the floor to be released")
    wait_for(lambda: "released the power floor" in daemon.log(), 10.0, "the release's log line")


def test_daemon_gpu_plays_floors_and_a_gpu_without_smoothing_says_why(
    start_daemon: Callable[..., Daemon], workdir: Path
) -> None:
    daemon, state = _daemon(start_daemon, workdir, "--simulate-smoothing")
    gpu = DaemonGpu(0, socket=daemon.socket)
    try:
        assert gpu.floor_unavailable() is None
        assert gpu.set_power_floor(200.0, 800.0) is True
        assert _smoothing(state)["floor_w"] == pytest.approx(200.0)
        assert _smoothing(state)["params"][f"0:{UP}"] == 800.0
        assert gpu.set_power_floor(0.0) is True
        assert _smoothing(state)["floor_w"] == 0.0
        assert gpu.set_power_floor(300.0, 800.0) is True
    finally:
        gpu.close()  # the lease ends: the daemon releases the floor
    wait_for(lambda: _smoothing(state)["floor_w"] == 0.0, 10.0, "the floor to be released")
    daemon.kill()
    plain, _ = _daemon(start_daemon, workdir)
    gpu = DaemonGpu(0, socket=plain.socket)
    try:
        assert "power smoothing" in (gpu.floor_unavailable() or "")
        assert gpu.set_power_floor(200.0) is False
    finally:
        gpu.close()


def test_a_floor_left_by_a_killed_daemon_is_released_when_it_starts_again(
    start_daemon: Callable[..., Daemon],
    start_peer: Callable[..., PeerProcess],
    workdir: Path,
) -> None:
    record = workdir / "gpud.state.json"
    daemon, state = _daemon(start_daemon, workdir, "--simulate-smoothing", "--state", str(record))
    peer = start_peer(daemon.socket, "--uid", str(NOBODY), "--gid", str(NOGROUP))
    assert peer.cmd("lease 0")["ok"]
    assert peer.cmd("floor 120 0")["applied"]
    assert json.loads(record.read_text())["floors"] == {daemon.status()[0]["uuid"]: 120.0}
    daemon.kill()  # SIGKILL: no chance to release the floor
    peer.kill()
    assert _smoothing(state)["floor_w"] == pytest.approx(120.0)
    again, _ = _daemon(start_daemon, workdir, "--simulate-smoothing", "--state", str(record))
    sm = _smoothing(state)
    assert sm["floor_w"] == 0.0 and not sm["enabled"]
    assert "floors" not in json.loads(record.read_text())
    assert "left by an earlier run" in again.log()
