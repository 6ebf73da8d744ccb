"""``perseus serve`` that cannot start exits (with the reason) instead of hanging.

A failure while the servers are built (the REST app, the gRPC port) leaves nothing running, and
the kernel warm-up's child process, cancelled however early, never keeps the process alive.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_exits_when_the_app_cannot_be_built(tmp_path: Path) -> None:
    # The REST app raising while it is built, in a real ``perseus serve`` process whose kernel
    # warm-up is on: the process used to hang in asyncio's shutdown, waiting on the warm-up's
    # child process it had begun to spawn.
    script = textwrap.dedent(
        """
        import sys
        import perseus_server.server as server

        def create_app(*args, **kwargs):
            raise RuntimeError("the app could not be built")

        server.create_app = create_app
        from perseus_server.cli import main

        sys.exit(main(sys.argv[1:]))
        """
    )
    env = dict(os.environ, PERSEUS_WARM_KERNELS="1")
    db = tmp_path / "p.db"
    args = ["--db", str(db), "--http-port", "0", "--grpc-port", "0"]
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "RuntimeError: the app could not be built" in proc.stderr
    assert "listening" not in proc.stdout  # it never said it served
