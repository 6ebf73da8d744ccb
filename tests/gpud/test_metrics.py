"""gpud's Prometheus metrics and its log, from a real ``perseus gpud --simulate``.

The metrics page and the textfile are parsed with ``prometheus_client``'s parser (a real Prometheus
text parser) and checked for the naming conventions and the values a client set; the log has one
INFO line per lease, release, reset and refusal, and clock changes only at DEBUG.
"""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpud_harness
import pytest
from gpud_harness import Daemon, wait_for
from prometheus_client.parser import text_string_to_metric_families

from perseus_client import DaemonGpu
from perseus_client.errors import GpudRefusedError
from perseus_client.gpu.daemon_connection import GpudConnection
from perseus_common.proto import gpud_pb2
from perseus_gpud.simnvml import simulated_uuid

workdir = gpud_harness.workdir
start_daemon = gpud_harness.start_daemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")

UNITS = ("hertz", "watts", "joules", "seconds")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def check_conventions(text: str) -> None:
    """Prometheus naming: a prefix, base units named, ``_total`` only on counters."""
    fams = families(text)
    assert fams, "no metrics"
    for name, fam in fams.items():
        assert re.fullmatch(r"perseus_gpud_[a-z_]+", name), name
        assert not re.search(r"_(mhz|milli\w*|kilo\w*|percent|mj|mw)(_|$)", name), name
        for sample in fam.samples:
            if fam.type == "counter":
                assert sample.name == name + "_total", f"counter {sample.name} lacks _total"
            else:
                assert not sample.name.endswith("_total"), f"{fam.type} {sample.name} has _total"
        if name.endswith("_info"):
            assert fam.type == "gauge" and all(s.value == 1 for s in fam.samples)
    for needle, unit in (("clock", "hertz"), ("power", "watts"), ("energy", "joules")):
        for name in fams:
            if needle in name and "reason" not in name:
                assert name.endswith("_" + unit), f"{name} should be in {unit}"


def value(fams: dict[str, Any], name: str, **labels: str) -> float:
    fam_name = name.removesuffix("_total")
    matches = [
        s.value
        for s in fams[fam_name].samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} samples"
    return float(matches[0])


def test_metrics_page_and_textfile(start_daemon: Callable[..., Daemon], workdir: Path) -> None:
    port = free_port()
    textfile = workdir / "gpud.prom"
    throttle = workdir / "throttle.json"
    throttle.write_text(json.dumps({"0": {"cap_mhz": 1005, "reasons": ["hw_thermal_slowdown"]}}))
    daemon = start_daemon(
        "--simulate", "2", "--metrics-port", str(port), "--metrics-textfile", str(textfile),
        "--metrics-interval", "0.2", "--simulate-throttle", str(throttle),
    )  # fmt: skip
    daemon.own(1)
    gpu = DaemonGpu(1, socket=daemon.socket, job="0123456789abcdef", tenant="team-a")
    gpu.set_locked_clocks(1005)
    with GpudConnection(daemon.socket) as conn, pytest.raises(GpudRefusedError):
        conn.call(lease=gpud_pb2.GpuRef(index=0))  # not its GPU: a refusal
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
        check_conventions(text)
        fams = families(text)
        u0, u1 = simulated_uuid(0), simulated_uuid(1)
        assert fams["perseus_gpud_energy_joules"].type == "counter"
        assert value(fams, "perseus_gpud_sm_clock_locked_hertz", uuid=u1) == 1005e6
        locked = fams["perseus_gpud_sm_clock_locked_hertz"].samples
        assert [s.labels["uuid"] for s in locked] == [u1]  # GPU 0 is not locked: no sample
        assert value(fams, "perseus_gpud_sm_clock_hertz", uuid=u0) == 1005e6  # throttled
        assert value(fams, "perseus_gpud_sm_clock_hertz", uuid=u1) == 1005e6  # locked
        r0 = value(
            fams, "perseus_gpud_clock_event_reason_active", uuid=u0, reason="hw_thermal_slowdown"
        )
        r1 = value(
            fams, "perseus_gpud_clock_event_reason_active", uuid=u1, reason="hw_thermal_slowdown"
        )
        assert (r0, r1) == (1.0, 0.0)
        assert 60 < value(fams, "perseus_gpud_power_watts", uuid=u1) < 400
        assert value(fams, "perseus_gpud_energy_joules_total", uuid=u1) > 0
        assert (
            value(fams, "perseus_gpud_leased", uuid=u0),
            value(fams, "perseus_gpud_leased", uuid=u1),
        ) == (0, 1)
        info = value(
            fams,
            "perseus_gpud_lease_holder_info",
            uuid=u1,
            pid=str(os.getpid()),
            uid="0",
            owned_by="device-node",
            perseus_job="0123456789abcdef",
            tenant="team-a",
        )
        assert info == 1
        # The holder is named in the info series only: no GPU series churns with the holder.
        for fam in fams.values():
            if fam.name != "perseus_gpud_lease_holder_info":
                for sample in fam.samples:
                    assert not {"pid", "pod", "perseus_job"} & set(sample.labels), sample
        # Prometheus's `job` is the scrape's: no series of gpud's carries one.
        assert not [s for f in fams.values() for s in f.samples if "job" in s.labels]
        refusals = value(fams, "perseus_gpud_refusals_total", uuid=u0, reason="NOT_OWNER", uid="0")
        assert refusals == 1
        assert value(fams, "perseus_gpud_connections") >= 1
        assert value(fams, "perseus_gpud_start_time_seconds") > 1.7e9
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=30)
        assert err.value.code == 404
        # The textfile (rewritten every 0.2 s) says the same, parsed the same way.
        # One snapshot, read once: the file is rewritten every 0.2 s, and reads of two
        # rewrites may differ.
        snapshot: list[str] = []

        def written_after_the_lease() -> bool:
            snapshot[:] = [textfile.read_text()] if textfile.exists() else []
            return bool(snapshot) and "perseus_gpud_lease_holder_info{" in snapshot[0]

        wait_for(written_after_the_lease, 10.0, "a metrics textfile written after the lease")
        check_conventions(snapshot[0])
        from_file = families(snapshot[0])
        assert value(from_file, "perseus_gpud_sm_clock_locked_hertz", uuid=u1) == 1005e6
    finally:
        gpu.close()
    # Released: the next textfile shows no holder.
    wait_for(
        lambda: "perseus_gpud_lease_holder_info{" not in textfile.read_text(),
        10.0,
        "a new textfile",
    )


def test_the_log_has_one_info_line_per_event_and_clock_changes_at_debug(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon("--simulate", "2")
    daemon.own(0)
    gpu = DaemonGpu(0, socket=daemon.socket)
    for i in range(40):
        gpu.set_locked_clocks(1005 if i % 2 else 1200)
    with GpudConnection(daemon.socket) as conn:
        for _ in range(2):
            with pytest.raises(GpudRefusedError):
                conn.call(lease=gpud_pb2.GpuRef(index=1))
    gpu.close()
    wait_for(lambda: "lease of pid" in daemon.log(), 10.0, "the release line")
    log = daemon.log()
    info = [ln for ln in log.splitlines() if " INFO " in ln]
    assert sum("leased by" in ln for ln in info) == 1
    [release] = [ln for ln in info if "lease of pid" in ln]
    assert "after 40 clock changes; resetting its clocks" in release
    assert sum("refused lease" in ln for ln in info) == 2
    assert "locked the SM clock" not in log  # clock changes are DEBUG
    assert len(info) < 12, "\n".join(info)

    verbose = Daemon(daemon.workdir, ["--simulate", "1", "--log-level", "DEBUG"])
    verbose.socket = str(daemon.workdir / "verbose.sock")
    verbose.log_path = daemon.workdir / "verbose.log"
    verbose.start()
    try:
        verbose.own(0)
        g = DaemonGpu(0, socket=verbose.socket)
        g.set_locked_clocks(1005)
        g.close()
        wait_for(lambda: "locked the SM clock at 1005 MHz" in verbose.log(), 10.0, "a DEBUG line")
    finally:
        verbose.kill()


def test_a_lease_label_is_checked(
    start_daemon: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job and tenant a client names at lease time are bounded labels.

    Older clients send none and lease as before; ``DaemonGpu`` takes them from
    ``$PERSEUS_JOB``/``$PERSEUS_TENANT``, clipped to what the daemon accepts (a long label never
    costs the lease).
    """
    daemon = start_daemon("--simulate", "1")
    daemon.own(0)
    with GpudConnection(daemon.socket) as conn:
        with pytest.raises(GpudRefusedError, match="lease.job: at most 128") as info:
            conn.call(lease=gpud_pb2.GpuRef(index=0, job="x" * 129))
        assert info.value.code == "INVALID_ARGUMENT"
        with pytest.raises(GpudRefusedError, match="lease.tenant: must be printable"):
            conn.call(lease=gpud_pb2.GpuRef(index=0, tenant="a\nb"))
        conn.call(lease=gpud_pb2.GpuRef(index=0))  # an older client
        holder = daemon.status()[0]["holder"]
        assert (holder["job"], holder["tenant"]) == ("", "")
        conn.call(release=gpud_pb2.GpuRef(index=0))
    monkeypatch.setenv("PERSEUS_JOB", "j" * 200)
    monkeypatch.setenv("PERSEUS_TENANT", "team-b\n")
    gpu = DaemonGpu(0, socket=daemon.socket)
    try:
        holder = daemon.status()[0]["holder"]
        assert (holder["job"], holder["tenant"]) == ("j" * 128, "team-b")
    finally:
        gpu.close()
