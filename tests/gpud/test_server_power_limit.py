"""The node daemon reads each GPU's maximum power limit from NVML and sends it with the lease.

So a trainer without NVML access (``DaemonGpu``) registers it too.
"""

from __future__ import annotations

from collections.abc import Callable

import gpud_harness
from gpud_harness import Daemon

from perseus_client import DaemonGpu

start_daemon = gpud_harness.start_daemon
workdir = gpud_harness.workdir


def test_daemon_gpu_reports_nvmls_max_power_limit(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon("--simulate", "1", "--ownership", "none")  # ownership: test_ownership
    gpu = DaemonGpu(0, socket=daemon.socket)
    try:
        assert gpu.max_power_limit_w() == 400.0  # the simulated A100 SXM's constraints
    finally:
        gpu.close()
