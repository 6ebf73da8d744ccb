"""Fixtures of the node-daemon tests (the helpers are in ``gpud_harness``)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integrations"))  # integration_harness (torch e2e)
sys.path.insert(0, str(HERE))

from gpud_harness import Daemon, Trainer  # noqa: E402


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
def start_daemon(workdir: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(*args: str) -> Daemon:
        daemon = Daemon(workdir, list(args)).start()
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
