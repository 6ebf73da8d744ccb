"""Warming the kernels ahead of time (``python -m perseus.kernels.warm``)."""

from __future__ import annotations

import subprocess
import sys


def test_warm_leaves_nothing_to_compile() -> None:
    """After ``python -m perseus.kernels.warm``, a fresh process compiles nothing.

    The tests' own process has run the kernels already.
    """
    for args in ([], ["--check"]):  # the first compiles whatever a cold cache lacks
        out = subprocess.run(
            [sys.executable, "-m", "perseus.kernels.warm", *args],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert out.returncode == 0, out.stderr
    assert " 0 compiled now" in out.stdout
