"""``perseus_client.gpu.vendors``: a GPU vendor is one registry entry.

An entry whose availability probe says yes is what the client's default backend and the node
daemon open; NVML's is first.
"""

from __future__ import annotations

import pytest
from client_data import PROFILE

from perseus_client.defaults import backend_factory
from perseus_client.gpu import vendors
from perseus_client.gpu.base import DeviceIdentity, GpuVendor
from perseus_client.gpu.nvml import vendor
from perseus_client.gpu.simulated import SimulatedGpu
from perseus_gpud.devices import open_devices, open_gpus
from perseus_gpud.simnvml import SimulatedNvml


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
