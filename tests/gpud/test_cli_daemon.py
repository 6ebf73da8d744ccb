"""``perseus_gpud.cli``: ``perseus gpud [serve]`` and ``perseus gpud status``.

Options checked with a message (never a traceback), state files refused naming the file,
``status`` as a table and as JSON from a real ``perseus gpud --simulate``, and an unreachable
daemon said in words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gpud_harness
import pytest
from gpud_harness import Daemon, child_env

from perseus_client import DaemonGpu
from perseus_client.errors import GpudUnavailableError
from perseus_gpud.cli import main as gpud_main

workdir = gpud_harness.workdir
start_daemon = gpud_harness.start_daemon

#: As in the daemon's other suites: a root daemon, or checks made as root.
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")


@as_root
@pytest.mark.parametrize(
    ("option", "content", "expected"),
    [
        ("--state", "{not json", "not JSON"),
        ("--state", '{"version": 1, "locked": {"GPU-1": "fast"}}', "not a lock record"),
        ("--state", "[]", "not a lock record"),
        ("--simulate-state", "{oops", "cannot be read as JSON"),
        ("--simulate-state", '{"gpus": [{"locked_mhz": 1005}]}', "is malformed"),
    ],
)
def test_a_malformed_state_file_is_a_clear_error(
    workdir: Path, option: str, content: str, expected: str
) -> None:
    path = workdir / "state.json"
    path.write_text(content)
    out = subprocess.run(
        [sys.executable, "-m", "perseus_gpud", "--socket", str(workdir / "s.sock"),
         "--simulate", "1", option, str(path)],
        capture_output=True, text=True, env=child_env(), timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert expected in out.stderr and str(path) in out.stderr
    assert path.read_text() == content  # nothing overwritten


@as_root
def test_unreachable_daemon(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(workdir / "none.sock")
    assert gpud_main(["status", "--socket", missing]) == 1
    assert "cannot reach the Perseus node daemon" in capsys.readouterr().err
    with pytest.raises(GpudUnavailableError, match="is `perseus gpud` running"):
        DaemonGpu(0, socket=missing, connect_timeout=0.2)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--gpus", "0,0"], "expected distinct GPU indices >= 0"),
        (["--gpus", "a"], "expected GPU indices like 0,1,3"),
        (["--ownership", "magic"], "expected auto, none, or device-node and/or pod-resources"),
        (["--max-connections", "0"], "must be >= 1"),
        (["--metrics-interval", "0"], "must be > 0"),
        (["--group", "no-such-group-here"], "no group named"),
    ],
)
def test_a_bad_option_is_refused_naming_it(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        gpud_main(["serve", *argv])
    assert info.value.code == 2
    assert expected in capsys.readouterr().err


def test_the_simulation_options_need_simulate(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--socket", str(workdir / "s.sock"), "--simulate-smoothing"]
    assert gpud_main(argv) == 2
    assert "need --simulate N" in capsys.readouterr().err
    assert not (workdir / "s.sock").exists()


@as_root
def test_status_prints_each_gpu_its_lock_and_holder(
    start_daemon: Callable[..., Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = start_daemon("--simulate", "2", "--ownership", "none")
    gpu = DaemonGpu(1, socket=daemon.socket)
    try:
        gpu.set_locked_clocks(1005)
        assert gpud_main(["status", "--socket", daemon.socket, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [(r["index"], r["locked_mhz"], r["holder"] is None) for r in rows] == [
            (0, None, True),
            (1, 1005, False),
        ]
        assert rows[1]["holder"]["pid"] == os.getpid()
        assert gpud_main(["status", "--socket", daemon.socket]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split() == ["GPU", "uuid", "locked", "holder"]
        assert "1005 MHz" in table[2] and f"pid {os.getpid()} uid 0" in table[2]
        assert table[1].split()[2:] == ["none", "none"]
    finally:
        gpu.close()
