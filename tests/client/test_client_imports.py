"""A client constructed after its process can no longer import anything still works.

A launcher may import the client and then drop privileges (or enter a sandbox) before it
constructs one; the ``.venv`` of a clone in a directory only its owner may enter (mode 0700, the
default home directory on several distributions) is then unreadable. The client must have imported
everything it needs when it was imported: ``grpc`` loads its channel module lazily, on the first
``insecure_channel`` call, which failed as ``ImportError: cannot import name '_channel' from
'grpc'`` once the tree was unreadable.

Real parts: a ``perseus serve`` subprocess, a rank subprocess (``sealed_trainer.py``) that records
every import attempted after ``import perseus_client`` while it registers, receives the plan,
runs three iterations and sends its reports. ``test_clock_control_failopen.py`` drops a real rank to
``nobody`` as well; this test does not depend on where the clone lies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_client_e2e import TOKEN, create_job, start_server

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def test_nothing_is_imported_after_the_client_package(tmp_path: Path, profile_text: str) -> None:
    srv = start_server(tmp_path)
    try:
        job = create_job(srv, profile_text)
        done = subprocess.run(
            [sys.executable, str(HERE / "sealed_trainer.py"), srv.grpc_target, job, TOKEN],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=HERE,
        )
    finally:
        srv.stop()
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # The rank really ran connected: the deployed plan arrived, every instruction was clocked,
    # reports were sent.
    assert seen["connected"] and seen["plan_version"] >= 1, seen
    assert seen["steps"] == 4 and seen["clocks_set"] == 12, seen
    assert seen["reports_sent"] >= 1, seen
    assert seen["late_imports"] == [], seen
