"""Helpers and fixtures of the node-daemon tests.

Real ``perseus gpud --simulate`` subprocesses on temporary sockets, trainer processes
(``trainer.py``) that can run as an unprivileged user, and a launcher for torch rank processes.

The fixtures live here, imported by the test modules, rather than in a ``conftest.py``: other test
directories import helpers with ``from conftest import ...``, which a third ``conftest`` module
would shadow.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perseus_client.errors import GpudUnavailableError
from perseus_gpud.cli import status_rows

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "client" / "integrations"))  # integration_harness (torch e2e)
REPO = HERE.parents[1]
NOBODY = 65534
NOGROUP = 65534


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO / p) for p in ("", "client", "gpud", "common", "server")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


#: Seconds of the clock a wait on a process's own progress (:func:`wait_for` with ``process``)
#: gives up after, whatever its CPU time: a process blocked without using any.
STUCK_S = 300.0


def cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds process ``pid`` has used so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    step: float = 0.02,
    process: subprocess.Popen[bytes] | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``.

    With ``process``, ``timeout`` counts that process's CPU seconds, not the clock's: on a loaded
    machine a process's start takes many times its CPU time (a daemon's imports, 0.65 s of CPU,
    took 12 s at load 13), so a deadline on the clock fails a start that is only slow. The wait
    still ends after :data:`STUCK_S` of the clock, or as soon as the process exits.
    """
    limit = timeout if process is None else STUCK_S
    deadline = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is None and cpu_seconds(process.pid) > timeout:
            pytest.fail(f"{what}: not after {timeout} s of the process's CPU time")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit} s waiting for {what}")
        time.sleep(step)


class Daemon:
    """One ``python -m perseus_gpud`` subprocess."""

    def __init__(self, workdir: Path, args: list[str], nofile: int | None = None) -> None:
        self.workdir = workdir
        self.nofile = nofile  # a soft open-file limit to start with (the daemon raises it)
        self.socket = str(workdir / "gpud.sock")
        self.args = args
        self.log_path = workdir / "gpud.log"
        #: The simulated device nodes (``--simulate``): files ``nvidia<N>`` a process opens to
        #: own GPU N, as CUDA opens ``/dev/nvidia<N>``.
        self.dev_dir = workdir / "gpud-dev"
        self.proc: subprocess.Popen[bytes] | None = None
        self._owned: list[Any] = []

    def own(self, index: int) -> None:
        """Open GPU ``index``'s simulated device node in this process (kept open until kill)."""
        self._owned.append(open(self.dev_dir / f"nvidia{index}", "rb"))  # noqa: SIM115

    def start(self) -> Daemon:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "perseus_gpud", "--socket", self.socket, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(),
                preexec_fn=self._limit if self.nofile is not None else None,
            )
        try:
            wait_for(self._ready, 20.0, f"the daemon to serve on {self.socket}", process=self.proc)
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}\n{self.log()}")
        return self

    def _limit(self) -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, hard))

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"the daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            status_rows(self.socket, timeout=1.0)
        except GpudUnavailableError:
            return False
        return True

    def status(self) -> list[dict[str, Any]]:
        return status_rows(self.socket, timeout=5.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.disown()

    def disown(self) -> None:
        for f in self._owned:
            f.close()
        self._owned.clear()

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


class Trainer:
    """One ``trainer.py`` subprocess (see its docstring)."""

    def __init__(self, workdir: Path, name: str, socket: str, args: list[str]) -> None:
        self.progress = workdir / f"{name}.progress"
        self.log_path = workdir / f"{name}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "trainer.py"),
                "--socket",
                socket,
                "--progress",
                str(self.progress),
                "--log",
                str(self.log_path),
                "--device-dir",
                str(workdir / "gpud-dev"),
                *args,
            ],
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / f"{name}.stderr", "wb"),  # noqa: SIM115
        )
        self.pid = self.proc.pid

    def iterations(self) -> int:
        return len(self.progress.read_text().splitlines()) if self.progress.exists() else 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            with_signal(self.proc, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


class PeerProcess:
    """One ``peer.py`` subprocess driven line by line (see its docstring)."""

    def __init__(self, socket: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peer.py"), "--socket", socket, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**child_env(), **(env or {})},
            text=True,
        )
        self.pid = self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def cmd(self, line: str) -> Any:
        self.send(line)
        return self.read(line)

    def read(self, line: str = "") -> Any:
        """The answer to the command sent last."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.readline()
        if not out:
            pytest.fail(f"peer {self.pid} exited with {self.proc.wait()} on {line!r}")
        return json.loads(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def holder(row: dict[str, Any]) -> tuple[int, int] | None:
    """``(pid, uid)`` of a status row's holder (``None``: not leased)."""
    h = row["holder"]
    return None if h is None else (h["pid"], h["uid"])


def with_signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, sig)


def run_ranks(
    script: str, world: int, config: dict[str, Any], out: Path, timeout: float = 240.0
) -> None:
    """Run ``world`` copies of ``script`` (``--rank r --world w --config --out``) over gloo."""
    from integration_harness import launch_ranks

    launch_ranks(HERE / script, world, config, out, timeout, child_env()["PYTHONPATH"])


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory an unprivileged user can traverse (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="perseus-gpud-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_peer() -> Iterator[Callable[..., PeerProcess]]:
    started: list[PeerProcess] = []

    def start(socket: str, *args: str, env: dict[str, str] | None = None) -> PeerProcess:
        peer = PeerProcess(socket, *args, env=env)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()


@pytest.fixture
def start_daemon(workdir: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(*args: str, nofile: int | None = None) -> Daemon:
        daemon = Daemon(workdir, list(args), nofile).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


@pytest.fixture
def start_trainer(workdir: Path) -> Iterator[Callable[..., Trainer]]:
    started: list[Trainer] = []

    def start(name: str, socket: str, *args: str) -> Trainer:
        trainer = Trainer(workdir, name, socket, list(args))
        started.append(trainer)
        return trainer

    yield start
    for trainer in started:
        trainer.kill()
