"""``perseus_gpud.replies``: the GPU a request names, and the daemon's reply messages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from perseus_common.proto import gpud_pb2
from perseus_gpud.devices import ManagedGpu, open_gpus
from perseus_gpud.ownership import Owner
from perseus_gpud.peers import Peer
from perseus_gpud.replies import clock_state, gpu_info, holder_labels, resolve_gpu, status_message
from perseus_gpud.simnvml import SimulatedNvml


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[int, ManagedGpu]]:
    monkeypatch.setattr("os.geteuid", lambda: 0)  # the simulated NVML: only root locks clocks
    opened = open_gpus(SimulatedNvml(2), None, read_only=False)
    yield {g.index: g for g in opened}
    for g in opened:
        g.reset()
        g.close()


def test_a_gpu_is_named_by_uuid_a_long_enough_prefix_or_index(
    gpus: dict[int, ManagedGpu],
) -> None:
    one = gpus[1]
    assert resolve_gpu(gpus, gpud_pb2.GpuRef(uuid=one.uuid)) is one
    assert resolve_gpu(gpus, gpud_pb2.GpuRef(uuid=one.uuid[:-1])) is one  # a unique prefix
    assert resolve_gpu(gpus, gpud_pb2.GpuRef(index=1)) is one
    assert resolve_gpu(gpus, gpud_pb2.SetClock(index=0, mhz=1005)) is gpus[0]


def test_a_name_that_matches_none_or_two_says_what_is_managed(
    gpus: dict[int, ManagedGpu],
) -> None:
    with pytest.raises(LookupError, match="GPU 5 is not managed by this daemon .it manages 0, 1"):
        resolve_gpu(gpus, gpud_pb2.GpuRef(index=5))
    with pytest.raises(LookupError, match=gpus[0].uuid):
        resolve_gpu(gpus, gpud_pb2.GpuRef(uuid="GPU-nope"))
    common = gpus[0].uuid[:12]
    gpus[1].uuid = common + "0" * (len(gpus[0].uuid) - 12)  # two UUIDs of one start
    with pytest.raises(LookupError, match="the prefix is ambiguous"):
        resolve_gpu(gpus, gpud_pb2.GpuRef(uuid=common))
    with pytest.raises(LookupError, match="it manages none"):
        resolve_gpu({}, gpud_pb2.GpuRef(index=0))


def test_gpu_info_and_clock_state(gpus: dict[int, ManagedGpu]) -> None:
    gpu = gpus[0]
    info = gpu_info(gpu)
    assert (info.index, info.uuid, info.name) == (0, gpu.uuid, gpu.name)
    assert tuple(info.supported_clocks_mhz) == gpu.clocks
    assert info.floor_unavailable == gpu.floor_unavailable  # no power smoothing here
    state = clock_state(gpu, applied=True)
    assert state.applied and not state.HasField("locked_mhz")
    gpu.lock(1005)
    assert clock_state(gpu, applied=True).locked_mhz == 1005


def test_a_read_only_gpu_says_it_applies_no_floor() -> None:
    [gpu] = open_gpus(SimulatedNvml(1, smoothing=True), None, read_only=True)
    try:
        assert "read-only" in gpu_info(gpu).floor_unavailable
    finally:
        gpu.close()


def test_status_lists_the_visible_gpus_their_locks_and_holders(
    gpus: dict[int, ManagedGpu],
) -> None:
    gpus[1].lock(1005)
    owner = Owner("device-node", pod="p", namespace="ns", slurm_job="42", job="j", tenant="t")
    held = {1: (Peer(321, 1000, 1000), owner)}
    status = status_message(gpus, held.get, read_only=False, lease_timeout=30.0)
    assert status.lease_timeout_s == 30.0 and not status.read_only
    first, second = status.gpus
    assert not first.HasField("locked_mhz") and not first.HasField("holder")
    assert second.locked_mhz == 1005
    holder = second.holder
    assert (holder.pid, holder.uid, holder.owned_by) == (321, 1000, "device-node")
    assert (holder.pod, holder.namespace, holder.slurm_job) == ("p", "ns", "42")
    assert (holder.job, holder.tenant) == ("j", "t")
    mine = status_message(gpus, held.get, read_only=False, lease_timeout=30.0, visible={1})
    assert [g.index for g in mine.gpus] == [1]


def test_holder_labels_for_log_lines() -> None:
    assert holder_labels(None) == ""
    assert holder_labels(Owner("unchecked")) == ""
    owner = Owner("pod-resources", pod="p", namespace="ns", slurm_job="42", job="j", tenant="t")
    assert holder_labels(owner) == "; Perseus job j of t; pod ns/p; Slurm job 42"
    assert holder_labels(Owner("device-node", job="j")) == "; Perseus job j"
