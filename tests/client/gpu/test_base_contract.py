"""The device interface's contract (``perseus_client.gpu.base``), run over every backend.

Every :class:`~perseus_client.gpu.base.GpuBackend` (NVML on the simulated NVML library the node
daemon's ``--simulate`` uses, in both modes; the node daemon's, through a real ``perseus gpud
--simulate``; the simulated GPU; the recording wrapper; the fail-open wrapper) answers the same identity, clock, sample and instruction calls the same way;
the node daemon manages them through it (``tests/gpud/test_devices.py``), and a vendor is one
registry entry (``test_vendors.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from client_data import PROFILE

from perseus_client.clock_control import FailOpenGpu
from perseus_client.errors import UnsupportedClockError
from perseus_client.gpu.base import DeviceIdentity, GpuBackend, device_minor
from perseus_client.gpu.daemon import DaemonGpu
from perseus_client.gpu.nvml import NvmlGpu
from perseus_client.gpu.recording import RecordingGpu
from perseus_client.gpu.simulated import SimulatedGpu
from perseus_common.clocks import CLOCK_EVENT_REASON_NAMES
from perseus_gpud.simnvml import SimulatedNvml

BACKENDS: dict[str, Callable[[], GpuBackend]] = {
    "nvml": lambda: NvmlGpu(1, nvml=SimulatedNvml(2)),
    "nvml-dry-run": lambda: NvmlGpu(0, dry_run=True, nvml=SimulatedNvml(1)),
    "simulated": lambda: SimulatedGpu(PROFILE, stage=0, time_scale=0.0),
    "recording": lambda: RecordingGpu(SimulatedGpu(PROFILE, stage=1, time_scale=0.0)),
    "fail-open": lambda: FailOpenGpu(lambda: NvmlGpu(0, nvml=SimulatedNvml(1))),
}


@pytest.fixture(autouse=True)
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated NVML lets only root change clocks, as NVML does."""
    monkeypatch.setattr("os.geteuid", lambda: 0)


REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gpud_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``perseus gpud --simulate 1`` (no ownership check) for the daemon's backend."""
    work = tmp_path_factory.mktemp("gpud")
    socket = str(work / "gpud.sock")
    env = {**os.environ}
    paths = [str(REPO / p) for p in ("client", "gpud", "common")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    args = ["--socket", socket, "--simulate", "1", "--ownership", "none"]
    args += ["--state", str(work / "state.json"), "--simulate-dev-dir", str(work / "dev")]
    with open(work / "gpud.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perseus_gpud", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    yield socket
    proc.kill()
    proc.wait()


@pytest.fixture(params=[*sorted(BACKENDS), "daemon"])
def gpu(request: pytest.FixtureRequest) -> Iterator[GpuBackend]:
    if request.param == "daemon":
        socket = request.getfixturevalue("gpud_socket")
        backend: GpuBackend = DaemonGpu(0, socket=socket, connect_timeout=30.0)
    else:
        backend = BACKENDS[request.param]()
    yield backend
    backend.reset_locked_clocks()
    backend.close()


def test_identity(gpu: GpuBackend) -> None:
    ident = gpu.identity()
    assert isinstance(ident, DeviceIdentity) and ident.index >= 0
    assert ident.uuid is None or ident.uuid.startswith("GPU-")
    assert ident.device_node is None or device_minor(ident.device_node) is not None
    assert gpu.identity() == ident  # stable


def test_clocks_lock_and_reset(gpu: GpuBackend) -> None:
    clocks = gpu.supported_clocks()
    assert clocks and all(isinstance(c, int) for c in clocks)
    assert list(clocks) == sorted(set(clocks), reverse=True) and gpu.max_clock == clocks[0]
    for mhz in (clocks[-1], clocks[0]):
        gpu.set_locked_clocks(mhz)
    with pytest.raises(UnsupportedClockError, match="MHz"):
        gpu.set_locked_clocks(clocks[0] + 1)
    gpu.reset_locked_clocks()
    gpu.reset_locked_clocks()  # idempotent


def test_samples(gpu: GpuBackend) -> None:
    reading = gpu.read_clock()
    if reading is not None:
        mhz, reasons = reading
        assert isinstance(mhz, int) and mhz > 0
        assert isinstance(reasons, frozenset) and reasons <= CLOCK_EVENT_REASON_NAMES
    power = gpu.power_w()
    assert power is None or (isinstance(power, float) and power >= 0)
    applied = gpu.sample_applied_clock()
    assert applied is None or applied[0] > 0
    before = gpu.energy_mj()
    gpu.begin_instruction("forward", 0, None)
    gpu.end_instruction()
    after = gpu.energy_mj()
    assert isinstance(before, int) and isinstance(after, int) and after >= before


def test_the_base_tracks_the_running_instruction(gpu: GpuBackend) -> None:
    assert gpu.running_instruction() is None
    gpu.begin_instruction("forward", 2, None)
    assert gpu.running_instruction() == ("forward", 2, None)
    gpu.end_instruction()
    assert gpu.running_instruction() is None
    gpu.begin_instruction("backward", 1, None)
    gpu.abort_instruction()
    assert gpu.running_instruction() is None


def test_a_lock_shows_in_the_clock_read(gpu: GpuBackend) -> None:
    low = gpu.supported_clocks()[-1]
    gpu.set_locked_clocks(low)
    reading = gpu.read_clock()
    if reading is not None and not getattr(gpu, "dry_run", False):
        assert reading[0] == low
