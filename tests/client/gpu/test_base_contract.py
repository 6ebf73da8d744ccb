"""The device interface's contract, run over every backend, and the vendor registry.

Every :class:`~perseus_client.gpu.base.GpuBackend` (NVML on the simulated NVML library the node
daemon's ``--simulate`` uses, in both modes; the node daemon's, through a real ``perseus gpud
--simulate``; the simulated GPU; the recording wrapper; the fail-open wrapper) answers the same identity, clock, sample and instruction calls the same way;
the node daemon manages any backend that tells a UUID and a device node; and a vendor is one
registry entry: an entry whose probe says yes is what the client's default backend and the
daemon open.
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
from perseus_client.defaults import backend_factory
from perseus_client.errors import GpuError, UnsupportedClockError
from perseus_client.gpu import vendors
from perseus_client.gpu.base import DeviceIdentity, GpuBackend, GpuVendor, device_minor
from perseus_client.gpu.daemon import DaemonGpu
from perseus_client.gpu.nvml import NvmlGpu, vendor
from perseus_client.gpu.recording import RecordingGpu
from perseus_client.gpu.simulated import SimulatedGpu
from perseus_common.clocks import CLOCK_EVENT_REASON_NAMES
from perseus_gpud.devices import ManagedGpu, open_devices, open_gpus
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


# --- the node daemon over the interface ---------------------------------------------------


def test_the_daemon_manages_a_backend_through_the_interface_only(tmp_path: Path) -> None:
    throttle = tmp_path / "throttle.json"
    throttle.write_text('{"1": {"cap_mhz": 1005, "reasons": ["hw_thermal_slowdown"]}}')
    nvml = SimulatedNvml(2, throttle_path=throttle)
    [managed] = open_gpus(nvml, [1], read_only=False)
    try:
        assert managed.uuid == managed.gpu.identity().uuid and managed.minor == 1
        assert managed.lock(1410)
        mhz, bits, names = managed.sample()
        assert (mhz, names) == (1005, ("hw_thermal_slowdown",)) and bits == 0x40
        assert managed.power_w() > 0 and managed.energy_mj() >= 0
        assert managed.reset()
    finally:
        managed.close()


def test_the_daemon_refuses_a_backend_without_a_uuid() -> None:
    with pytest.raises(GpuError, match="UUID"):
        ManagedGpu(SimulatedGpu(PROFILE, stage=0, time_scale=0.0), read_only=True)


# --- the registry ---------------------------------------------------------------------------


class OtherVendorGpu(SimulatedGpu):
    """What another vendor's module brings: a backend that tells its identity."""

    def __init__(self, index: int, dry_run: bool) -> None:
        super().__init__(PROFILE, stage=0, time_scale=0.0, name="Other GPU")
        self.index, self.dry_run = index, dry_run

    def identity(self) -> DeviceIdentity:
        return DeviceIdentity(self.index, f"GPU-other-{self.index}", f"/dev/other{self.index}")


def _other(available: bool) -> GpuVendor:
    return GpuVendor("other", lambda: available, OtherVendorGpu, lambda: 2)


def test_the_probe_picks_the_first_vendor_that_is_here_else_the_first() -> None:
    absent, present = _other(False), _other(True)
    nvml = vendor(SimulatedNvml(1))  # bound to a library: always available
    assert vendors.choose_vendor([absent, nvml]) is nvml
    assert vendors.choose_vendor([present, nvml]) is present
    assert vendors.choose_vendor([absent]) is absent  # its error then says why
    assert vendors.VENDORS[0].name == "nvml"


def test_a_vendor_is_one_entry_for_the_client_and_the_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = _other(True)
    monkeypatch.setattr(vendors, "VENDORS", (entry, *vendors.VENDORS))
    monkeypatch.delenv("PERSEUS_GPUD_SOCKET", raising=False)
    monkeypatch.delenv("PERSEUS_DRY_RUN", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr("perseus_common.gpud_wire.DEFAULT_SOCKET", "/nonexistent/gpud.sock")
    gpu = backend_factory()()
    assert isinstance(gpu, OtherVendorGpu) and gpu.identity().index == 1
    managed = open_devices(entry, None, read_only=True)
    assert [(m.index, m.uuid, m.minor) for m in managed] == [
        (0, "GPU-other-0", 0),
        (1, "GPU-other-1", 1),
    ]
    probed = open_gpus(None, [1], read_only=True)  # what `perseus gpud` opens without --simulate
    assert [(type(m.gpu), m.uuid) for m in probed] == [(OtherVendorGpu, "GPU-other-1")]
    for m in managed + probed:
        m.close()
