"""Off-plan instructions under a throttling daemon show up in the server's status and metrics.

A real ``perseus gpud --simulate`` daemon whose stand-in is throttled, a real client through
``DaemonGpu`` and a real server: the off-plan instructions show up in the server's status and
metrics.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import gpud_harness
import httpx
import pytest
from gpud_harness import REPO, Daemon, wait_for

from perseus.profiles import load_profile
from perseus_client import DaemonGpu, PerseusClient, RankPosition, Reporting
from perseus_server import ServerProcess

start_daemon = gpud_harness.start_daemon
workdir = gpud_harness.workdir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starts a root daemon")
THERMAL = "hw_thermal_slowdown"


def _a100_csv() -> str:
    """Two stages of the shipped A100 profile at four of its clocks (the stand-in's clocks)."""
    p = load_profile(REPO / "profiles" / "gpt3-175b_a100-sxm_8stage.csv")
    keep = set(p.frequencies[::10])
    rows = [r for r in p.records() if r["stage"] < 2 and r["frequency"] in keep]
    return "stage,instruction,frequency,time,energy\n" + "".join(
        f"{r['stage']},{r['instruction']},{r['frequency']},{r['time']!r},{r['energy']!r}\n"
        for r in rows
    )


def test_a_throttled_daemon_gpu_shows_up_in_the_servers_status_and_metrics(
    start_daemon: Callable[..., Daemon], workdir: Path, tmp_path: Path
) -> None:
    throttle = workdir / "throttle.json"
    daemon = start_daemon("--simulate", "1", "--simulate-throttle", str(throttle))
    with (
        ServerProcess(tmp_path / "perseus.db") as srv,
        httpx.Client(base_url=srv.http_url, headers=srv.headers, timeout=30) as http,
    ):
        r = http.post(
            "/jobs",
            json={"stages": 2, "microbatches": 2, "schedule": "1f1b", "blocking_power": 83.64},
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        r = http.put(f"/jobs/{job}/profile", content=_a100_csv(),
                     headers={"content-type": "text/csv"})  # fmt: skip
        assert r.status_code == 200, r.text
        assert http.post(f"/jobs/{job}/frontier").status_code == 202
        wait_for(
            lambda: (
                http.get(f"/jobs/{job}/frontier", params={"points": False}).json()["status"]
                == "done"
            ),
            120.0,
            "the frontier",
        )
        daemon.own(0)
        gpu = DaemonGpu(0, socket=daemon.socket, sample_interval=0.005)
        client = PerseusClient(srv.grpc_target, job, gpu=gpu, handle_signals=False, rank=RankPosition(global_rank=0, pipeline_rank=1), reporting=Reporting(report_interval=0.05))  # fmt: skip
        try:
            assert client.clock_sampler is None  # the daemon's heartbeat thread samples
            plan = wait_for(lambda: client.latest_plan, 30.0, "a plan")
            locked = min(s.frequency_mhz for s in plan.steps)
            throttle.write_text(json.dumps({"0": {"cap_mhz": 855, "reasons": [THERMAL]}}))
            assert locked > 870  # 855 MHz is more than one 15 MHz step below every lock
            for _ in range(4):
                with client.iteration():
                    for s in plan.steps:
                        with client.instruction(
                            s.instruction, microbatch=s.microbatch, stage=s.stage
                        ):
                            time.sleep(0.03)
            assert client.last_report is not None
            assert client.last_report.applied_clocks is not None
            assert client.link.flush(timeout=10)
        finally:
            client.close()
            gpu.close()

        def off_plan() -> dict | None:
            ranks = http.get(f"/jobs/{job}/status").json()["ranks"]
            clocks = ranks[0].get("applied_clocks")
            return clocks if clocks and clocks["off_plan"] else None

        clocks = wait_for(off_plan, 10.0, "the off-plan instructions in the status")
        assert clocks["reasons"] == [THERMAL] and clocks["samples"] > 0
        assert clocks["last_off_plan"]["sampled_mhz"] == 855
        assert clocks["last_off_plan"]["locked_mhz"] >= locked
        assert clocks["last_off_plan"]["stage"] == 1
        status = http.get(f"/jobs/{job}/status").json()
        assert status["pipelines"][0]["off_plan_ranks"] == [0]
        metrics = http.get("/metrics").text
        m = re.search(
            rf'^perseus_off_plan_instructions_total\{{perseus_job="{job}",rank="0",'
            rf'reason="{THERMAL}"\}} (\S+)$',
            metrics,
            re.M,
        )
        assert m and float(m.group(1)) >= 1, metrics
