"""``benchmarks/gpud_kubelet.py --smoke`` runs to the end and reports every lease.

It starts a root daemon and writes cgroup v1 ``name=systemd``: skipped where either cannot be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")

CGROUP_ROOT = Path("/sys/fs/cgroup/systemd")  # the hierarchy the benchmark writes


@pytest.fixture
def cgroups() -> None:
    """Skip unless this machine lets us create cgroups where the benchmark creates them."""
    probe = CGROUP_ROOT / f"perseus-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        pytest.skip(f"cannot create cgroups here: {exc}")


def test_the_benchmark_runs(cgroups: None) -> None:
    """``benchmarks/gpud_kubelet.py --smoke`` runs to the end and reports every lease.

    Its timings are the benchmark's business, not asserted here. It writes cgroups as
    ``tests/gpud/test_ownership_kubelet.py`` does (the fixture skips where that is impossible).
    """
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpud_kubelet.py"
    out = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert len(res["owner_lease_s"]) == 3 and all(x > 0 for x in res["owner_lease_s"])
    assert res["pod_lease_s"] and all(x > 0 for x in res["pod_lease_s"])  # NaN: refused
    assert res["list_calls"] >= 1
