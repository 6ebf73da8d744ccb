"""The daemon's protocol and rules, against a real ``perseus gpud --simulate`` subprocess.

Size bound, malformed requests, leases required, supported clocks only, read-only mode, stop resets,
injected throttling seen by ``DaemonGpu``'s applied-clock samples, default backend selection.
An unreachable daemon is ``test_cli_daemon.py``'s.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import gpud_harness
import pytest
from gpud_harness import Daemon, wait_for

from perseus_client import DaemonGpu, PerseusClient
from perseus_client.errors import GpudRefusedError
from perseus_client.gpu.daemon_connection import GpudConnection
from perseus_common.gpud_wire import MAX_FRAME, encode_frame, read_frame
from perseus_common.proto import gpud_pb2
from perseus_gpud.cli import main as gpud_main
from perseus_gpud.simnvml import SimulatedNvml, simulated_uuid

# The shared fixtures (see gpud_harness for why they are not in a conftest.py).
start_daemon = gpud_harness.start_daemon
workdir = gpud_harness.workdir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")


def raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5.0)
    s.connect(path)
    return s


def test_oversized_and_malformed_requests_are_refused(start_daemon: Callable[..., Daemon]) -> None:
    daemon = start_daemon("--simulate", "1")
    with raw(daemon.socket) as s:
        s.sendall(encode_frame(b"\xff\xff\xff"))  # not a Request
        reply = gpud_pb2.Response.FromString(read_frame(s))
        assert reply.error.code == gpud_pb2.INVALID_ARGUMENT and "malformed" in reply.error.message
        s.sendall(
            encode_frame(gpud_pb2.Request(id=5, heartbeat=gpud_pb2.Empty()).SerializeToString())
        )
        assert gpud_pb2.Response.FromString(read_frame(s)).id == 5  # still usable
        s.sendall(struct.pack(">I", MAX_FRAME + 1))  # announces too much: refused unread
        reply = gpud_pb2.Response.FromString(read_frame(s))
        assert reply.error.code == gpud_pb2.TOO_LARGE
        assert s.recv(1) == b""  # and disconnected
    with pytest.raises(ValueError, match="exceeds"):
        encode_frame(b"x" * (MAX_FRAME + 1))


def test_calls_need_a_lease_a_managed_gpu_and_a_supported_clock(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon("--simulate", "2", "--gpus", "1")
    daemon.own(1)
    with GpudConnection(daemon.socket) as conn:
        with pytest.raises(GpudRefusedError, match="not leased") as info:
            conn.call(set_clock=gpud_pb2.SetClock(index=1, mhz=1200))
        assert info.value.code == "NOT_LEASED"
        with pytest.raises(GpudRefusedError, match="not managed") as info:
            conn.call(lease=gpud_pb2.GpuRef(index=0))
        assert info.value.code == "NOT_FOUND"
        lease = conn.call(lease=gpud_pb2.GpuRef(index=1)).lease
        assert list(lease.gpu.supported_clocks_mhz)[:2] == [1410, 1395]
        with pytest.raises(GpudRefusedError, match="1201 MHz is not a supported") as info:
            conn.call(set_clock=gpud_pb2.SetClock(index=1, mhz=1201))
        assert info.value.code == "UNSUPPORTED_CLOCK"
        clock = conn.call(set_clock=gpud_pb2.SetClock(index=1, mhz=855)).clock
        assert clock.applied and clock.locked_mhz == 855
        assert daemon.status() == [
            {
                "index": 1,
                "uuid": simulated_uuid(1),
                "name": "NVIDIA A100-SXM4-80GB (simulated)",
                "locked_mhz": 855,
                "holder": {
                    "pid": os.getpid(),
                    "uid": 0,
                    "pod": "",
                    "namespace": "",
                    "slurm_job": "",
                    "owned_by": "device-node",
                    "job": "",
                    "tenant": "",
                },
            }
        ]
        released = conn.call(release=gpud_pb2.GpuRef(index=1)).clock
        assert not released.HasField("locked_mhz")
        assert daemon.status()[0]["holder"] is None


def test_read_only_never_sets_or_resets(start_daemon: Callable[..., Daemon], workdir: Path) -> None:
    state = workdir / "state.json"
    state.write_text(json.dumps({"gpus": [{"index": 0, "locked_mhz": 1005}]}))
    daemon = start_daemon(
        "--simulate", "1", "--simulate-state", str(state), "--read-only", "--log-level", "DEBUG"
    )
    daemon.own(0)
    gpu = DaemonGpu(0, socket=daemon.socket)
    assert gpu.read_only
    gpu.set_locked_clocks(1200)
    gpu.reset_locked_clocks()
    assert gpu.energy_mj() > 0
    gpu.close()
    assert daemon.stop() == 0
    # Left as found: not reset at start nor at stop, never locked (the file was not rewritten).
    assert SimulatedNvml.read_state(state) == {"gpus": [{"index": 0, "locked_mhz": 1005}]}
    assert "read-only: would lock the SM clock at 1200 MHz" in daemon.log()


def test_sigterm_resets_what_it_locked_and_removes_the_socket(
    start_daemon: Callable[..., Daemon], workdir: Path
) -> None:
    state = workdir / "state.json"
    daemon = start_daemon("--simulate", "2", "--simulate-state", str(state))
    daemon.own(1)
    gpu = DaemonGpu(1, socket=daemon.socket)
    gpu.set_locked_clocks(1005)
    assert SimulatedNvml.read_state(state)["gpus"][1]["locked_mhz"] == 1005
    assert daemon.stop() == 0
    assert [g["locked_mhz"] for g in SimulatedNvml.read_state(state)["gpus"]] == [None, None]
    assert not os.path.exists(daemon.socket)
    gpu.close()


def test_a_second_daemon_on_a_live_socket_refuses_to_start(
    start_daemon: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = start_daemon("--simulate", "1")
    assert gpud_main(["--socket", daemon.socket, "--simulate", "1"]) == 2
    assert daemon.status()[0]["index"] == 0  # the first one still serves


def test_throttled_gpu_shows_up_as_off_plan_instructions(
    start_daemon: Callable[..., Daemon], workdir: Path
) -> None:
    throttle = workdir / "throttle.json"
    daemon = start_daemon("--simulate", "1", "--simulate-throttle", str(throttle))
    daemon.own(0)
    gpu = DaemonGpu(0, socket=daemon.socket, sample_interval=0.01)
    gpu.set_locked_clocks(1410)
    gpu.begin_instruction("forward", 0, 0)
    wait_for(lambda: gpu.take_applied_clocks().samples > 0, 5.0, "on-plan samples")
    assert gpu.take_applied_clocks().off_plan == ()
    throttle.write_text(json.dumps({"0": {"cap_mhz": 1005, "reasons": ["hw_thermal_slowdown"]}}))
    time.sleep(0.1)
    gpu.end_instruction()
    gpu.take_applied_clocks()
    gpu.begin_instruction("backward", 3, 0)
    time.sleep(0.15)
    gpu.end_instruction()
    report = gpu.take_applied_clocks()
    assert report.samples > 0 and report.reasons == ("hw_thermal_slowdown",)
    [off] = report.off_plan
    assert (off.instruction, off.microbatch, off.stage) == ("backward", 3, 0)
    assert (off.locked_mhz, off.sampled_mhz, off.reasons) == (1410, 1005, ("hw_thermal_slowdown",))
    # One step away is within the plan; no instruction running: nothing recorded.
    throttle.write_text(json.dumps({"0": {"cap_mhz": 1395, "reasons": ["sw_power_cap"]}}))
    time.sleep(0.1)
    gpu.take_applied_clocks()
    gpu.begin_instruction("forward", 1, 0)
    time.sleep(0.1)
    gpu.end_instruction()
    report = gpu.take_applied_clocks()
    assert report.off_plan == () and report.reasons == ("sw_power_cap",)
    time.sleep(0.05)
    assert gpu.take_applied_clocks().samples == 0
    gpu.close()


def test_client_defaults_to_the_daemon_when_its_socket_is_configured(
    start_daemon: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = start_daemon("--simulate", "2")
    daemon.own(1)
    monkeypatch.setenv("PERSEUS_GPUD_SOCKET", daemon.socket)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # The runtime gave this process two GPUs by UUID; local rank 1 is the second: GPU 1.
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", f"{simulated_uuid(0)},{simulated_uuid(1)}")
    client = PerseusClient(offline=True, handle_signals=False)
    try:
        # The default backend, behind the client's fail-open wrapper.
        assert isinstance(client.gpu.backend, DaemonGpu) and client.gpu.backend.index == 1
        assert client.gpu.backend.uuid == simulated_uuid(1)
        assert client.clock_control == "active"
        assert gpud_harness.holder(daemon.status()[1]) == (os.getpid(), 0)
    finally:
        client.close()
    wait_for(lambda: daemon.status()[1]["holder"] is None, 5.0, "the lease to end at close")
