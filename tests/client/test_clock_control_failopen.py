"""Fail-open from the first line.

A real trainer process whose clock control is unavailable (node daemon's socket missing, refused or
not permitted, the GPU's lease held, NVML missing or not permitted) trains to completion at the
GPU's current clocks, takes control when it can, and the server shows each rank's clock control
(``GET /jobs/{id}/status``, ``/metrics``).

Every part is real: a ``perseus serve`` subprocess, ``perseus gpud --simulate`` subprocesses on
Unix sockets, trainer subprocesses (``failopen_trainer.py``, unprivileged where the cause needs
it). The only stand-in is NVML itself for the "not permitted" case (the project's simulated NVML,
which refuses clock locks to non-root as the real one does): this machine has no GPU.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpud"))

import gpud_harness  # noqa: E402
from gpud_harness import NOBODY, child_env, wait_for  # noqa: E402

from perseus_client import DaemonGpu  # noqa: E402

pytestmark = pytest.mark.slow

workdir = gpud_harness.workdir
start_daemon = gpud_harness.start_daemon
#: These trainers open no device node: the daemon's ownership check has its own tests
#: (tests/gpud/test_ownership.py); here any allowed peer may lease.
ANY_OWNER = ("--ownership", "none")
HERE = Path(__file__).resolve().parent
TOKEN = "failopen-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from perseus_server.testing.process import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("srv") / "perseus.db", token=TOKEN).start()
    try:
        yield srv
    finally:
        srv.stop()


def new_job(server: Any) -> str:
    with httpx.Client(base_url=server.http_url, headers=server.headers, timeout=30) as c:
        r = c.post(
            "/jobs",
            json={"stages": 2, "microbatches": 2, "schedule": "1f1b", "blocking_power": 50.0},
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def rank_status(server: Any, job: str) -> dict[str, Any]:
    with httpx.Client(base_url=server.http_url, headers=server.headers, timeout=30) as c:
        ranks = c.get(f"/jobs/{job}/status").json()["ranks"]
    assert len(ranks) <= 1
    return dict(ranks[0]) if ranks else {}  # {}: not registered yet


def without_control_metric(server: Any, job: str) -> float | None:
    with httpx.Client(base_url=server.http_url, headers=server.headers, timeout=30) as c:
        text = c.get("/metrics").text
    found = [  # one sample per node of the job (node="" when none lacks control)
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(f'perseus_ranks_without_clock_control{{perseus_job="{job}",node=')
    ]
    return sum(found) if found else None


class FailOpenTrainer:
    def __init__(
        self, server: Any, workdir: Path, env: dict[str, str], *args: str, name: str = "t"
    ) -> None:
        self.job = new_job(server)
        self.progress = workdir / f"{name}.progress"
        self.out = workdir / f"{name}.json"
        self.log_path = workdir / f"{name}.log"
        self.stderr_path = workdir / f"{name}.stderr"
        full_env = child_env()
        for key in ("PERSEUS_GPUD_SOCKET", "PERSEUS_DRY_RUN", "LOCAL_RANK", "RANK"):
            full_env.pop(key, None)
        full_env.update(env)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "failopen_trainer.py"),
                "--server",
                server.grpc_target,
                "--job",
                self.job,
                "--token",
                TOKEN,
                "--progress",
                str(self.progress),
                "--out",
                str(self.out),
                "--log",
                str(self.log_path),
                *args,
            ],
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.stderr_path, "wb"),  # noqa: SIM115
        )

    def iterations(self) -> int:
        return len(self.progress.read_text().splitlines()) if self.progress.exists() else 0

    def finish(self, timeout: float = 120.0) -> dict[str, Any]:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        err = self.stderr_path.read_text(errors="replace")
        assert rc == 0, f"trainer exited {rc}:\n{log}\n{err}"
        summary = json.loads(self.out.read_text())
        summary["log"] = log
        return dict(summary)


def check_unavailable_to_the_end(
    server: Any, t: FailOpenTrainer, summary: dict[str, Any], cause: str
) -> None:
    assert summary["iterations"] == 6  # trained to completion
    assert summary["first_state"] == summary["last_state"] == "unavailable"
    assert cause in summary["first_reason"], summary["first_reason"]
    # One warning, however many retries failed.
    assert summary["log"].count("clock control is unavailable") == 1, summary["log"]
    rank = rank_status(server, t.job)
    assert rank["clock_control"] == "unavailable"
    assert cause in rank["clock_control_reason"]
    assert rank["last_iteration"] == 5  # its reports were stored
    assert without_control_metric(server, t.job) == 1.0


def test_socket_missing_trains_then_takes_control_when_the_daemon_starts(
    server: Any, workdir: Path, start_daemon: Any
) -> None:
    sock = workdir / "gpud.sock"  # nothing listens there yet
    t = FailOpenTrainer(
        server, workdir, {"PERSEUS_GPUD_SOCKET": str(sock)}, "--iterations", "4", "--until-active"
    )
    wait_for(lambda: t.iterations() >= 2, 60.0, "two iterations without clock control")
    assert rank_status(server, t.job).get("clock_control") == "unavailable"
    assert without_control_metric(server, t.job) == 1.0
    daemon = start_daemon("--simulate", "1", *ANY_OWNER)
    assert daemon.socket == str(sock)
    # The trainer leases the GPU and locks the plan's clocks through the daemon.
    wait_for(
        lambda: any(g.get("locked_mhz") in (1200, 1005) for g in daemon.status()),
        60.0,
        "the trainer to lock a clock through the daemon",
    )
    summary = t.finish()
    assert summary["first_state"] == "unavailable"
    assert "No such file or directory" in summary["first_reason"]
    assert summary["last_state"] == "active" and summary["recoveries"] == 1
    assert summary["max_clock"] == 1410  # known once control was had
    states = [line.split()[1] for line in t.progress.read_text().splitlines()]
    assert states[0] == "unavailable" and states[-1] == "active"
    wait_for(
        lambda: rank_status(server, t.job).get("clock_control") == "active",
        30.0,
        "the server to see clock control active",
    )
    rank = rank_status(server, t.job)
    assert rank["clock_control_reason"] is None
    assert rank["supported_clocks_mhz"][0] == 1410  # registered again with the GPU's clocks
    assert without_control_metric(server, t.job) == 0.0


def test_socket_refused(server: Any, workdir: Path) -> None:
    sock = workdir / "refused.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock))  # bound, never listening: connections are refused
    try:
        t = FailOpenTrainer(server, workdir, {"PERSEUS_GPUD_SOCKET": str(sock)})
        summary = t.finish()
    finally:
        s.close()
    check_unavailable_to_the_end(server, t, summary, "Connection refused")


def test_socket_not_permitted(server: Any, workdir: Path, start_daemon: Any) -> None:
    daemon = start_daemon("--simulate", "1", "--group", "0", *ANY_OWNER)  # root:root 0660
    t = FailOpenTrainer(
        server, workdir, {"PERSEUS_GPUD_SOCKET": daemon.socket}, "--uid", str(NOBODY)
    )
    summary = t.finish()
    check_unavailable_to_the_end(server, t, summary, "Permission denied")
    assert all(g["holder"] is None and g["locked_mhz"] is None for g in daemon.status())


def test_lease_held_trains_then_takes_control_when_released(
    server: Any, workdir: Path, start_daemon: Any
) -> None:
    daemon = start_daemon("--simulate", "1", *ANY_OWNER)
    holder = DaemonGpu(0, socket=daemon.socket)
    holder.set_locked_clocks(1410)
    try:
        t = FailOpenTrainer(
            server,
            workdir,
            {"PERSEUS_GPUD_SOCKET": daemon.socket},
            "--iterations",
            "4",
            "--until-active",
        )
        wait_for(lambda: t.iterations() >= 2, 60.0, "two iterations while the lease is held")
        rank = rank_status(server, t.job)
        assert rank["clock_control"] == "unavailable"
        assert "GpudLeaseHeldError" in rank["clock_control_reason"]
    finally:
        holder.close()
    summary = t.finish()
    assert summary["first_state"] == "unavailable" and summary["last_state"] == "active"
    assert "GpudLeaseHeldError" in summary["first_reason"]
    wait_for(
        lambda: rank_status(server, t.job).get("clock_control") == "active",
        30.0,
        "the server to see clock control active",
    )


def test_nvml_missing(server: Any, workdir: Path) -> None:
    # No daemon socket configured or present: the default backend is NVML, and this machine has
    # no NVIDIA driver (libnvidia-ml cannot be loaded).
    assert not Path("/run/perseus/gpud.sock").exists()
    t = FailOpenTrainer(server, workdir, {})
    summary = t.finish()
    check_unavailable_to_the_end(server, t, summary, "GpuDriverError")


def test_nvml_not_permitted(server: Any, workdir: Path) -> None:
    t = FailOpenTrainer(server, workdir, {}, "--simulated-nvml", "--uid", str(NOBODY))
    summary = t.finish()
    # NVML opens the GPU for anyone; the first clock lock is refused to a non-root user.
    assert summary["iterations"] == 6
    assert summary["first_state"] == "active" and summary["last_state"] == "unavailable"
    assert "GpuPermissionError" in summary["last_reason"]
    rank = rank_status(server, t.job)
    assert rank["clock_control"] == "unavailable"
    assert "GpuPermissionError" in rank["clock_control_reason"]
    assert rank["last_iteration"] == 5
    assert without_control_metric(server, t.job) == 1.0


def test_daemon_lost_mid_run_is_reported_and_control_comes_back(
    server: Any, workdir: Path, start_daemon: Any
) -> None:
    daemon = start_daemon("--simulate", "1", *ANY_OWNER)
    stop = workdir / "stop"
    t = FailOpenTrainer(
        server,
        workdir,
        {"PERSEUS_GPUD_SOCKET": daemon.socket},
        "--iterations",
        "100000",
        "--stop-file",
        str(stop),
    )
    wait_for(lambda: rank_status(server, t.job).get("clock_control") == "active", 60.0, "control")
    daemon.stop()  # the node daemon goes away while the trainer runs
    wait_for(
        lambda: rank_status(server, t.job).get("clock_control") == "unavailable",
        60.0,
        "the server to hear that control was lost",
    )
    assert "lost the node daemon" in rank_status(server, t.job)["clock_control_reason"]
    assert without_control_metric(server, t.job) == 1.0
    start_daemon("--simulate", "1", *ANY_OWNER)  # back on the same socket
    wait_for(
        lambda: rank_status(server, t.job).get("clock_control") == "active",
        60.0,
        "control to come back",
    )
    stop.touch()
    summary = t.finish()
    assert summary["last_state"] == "active" and summary["recoveries"] == 0
    assert "lost the node daemon" in summary["log"]  # DaemonGpu's own warning, once
