"""A training process whose clock control may be unavailable (started by test_clock_control_failopen).

It builds a :class:`PerseusClient` with the *default* backend (chosen from the environment:
``PERSEUS_GPUD_SOCKET``, ``LOCAL_RANK``...) against a real server, runs ``--iterations``
iterations of a small two-clock plan, then (``--until-active``) goes on until clock control is
active and two more iterations ran with it. Each finished iteration appends
``<iteration> <clock_control>`` to ``--progress``; at the end it writes a JSON summary to
``--out`` (first and last state, the first reason, iterations, recoveries) and exits 0.
``--stop-file``: stop early once that file exists.

``--uid`` drops to that unprivileged user after everything is imported (this machine's
interpreter lives where other users cannot enter). ``--simulated-nvml`` serves NVML from the
project's simulated NVML (locking clocks needs root there, as with the real one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import grpc  # noqa: F401 - preloaded for setuid

import perseus_client.gpu.daemon  # noqa: F401 - preloaded for setuid
import perseus_client.gpu.daemon_connection  # noqa: F401 - preloaded for setuid
import perseus_client.gpu.nvml  # noqa: F401 - preloaded for setuid
import perseus_client.transport  # noqa: F401 - preloaded for setuid
import perseus_gpud.simnvml  # noqa: F401 - preloaded for setuid
from perseus_client import (
    Connection,
    FailOpen,
    PerseusClient,
    RankPosition,
    Reporting,
)
from perseus_common.proto import gpud_pb2, perseus_pb2
from perseus_common.wire.values import PlanStep, PlanUpdate

ORDER = [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--token", default=None)
    ap.add_argument("--uid", type=int)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--instruction-seconds", type=float, default=0.01)
    ap.add_argument("--until-active", action="store_true")
    ap.add_argument("--stop-file", help="stop before --iterations once this file exists")
    ap.add_argument("--simulated-nvml", action="store_true")
    ap.add_argument("--progress", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    log_file = open(args.log, "a", buffering=1)  # noqa: SIM115 - kept open for the whole run
    progress = open(args.progress, "a", buffering=1)  # noqa: SIM115
    out = open(args.out, "w")  # noqa: SIM115 - opened before setuid
    logging.basicConfig(level=logging.INFO, stream=log_file, format="%(levelname)s %(message)s")
    if args.simulated_nvml:
        from perseus_gpud.simnvml import SimulatedNvml

        sys.modules["pynvml"] = SimulatedNvml(1)  # type: ignore[assignment]
    # Exercise the protobuf runtimes once so nothing is loaded lazily after setuid.
    gpud_pb2.Response.FromString(gpud_pb2.Response(id=1).SerializeToString())
    perseus_pb2.IterationReport.FromString(perseus_pb2.IterationReport().SerializeToString())
    if args.uid is not None:
        os.setgroups([])
        os.setgid(args.uid)
        os.setuid(args.uid)
    client = PerseusClient(
        args.server,
        args.job,
        token=args.token,
        handle_signals=False,
        rank=RankPosition(global_rank=0, pipeline_rank=0, data_rank=0),
        reporting=Reporting(report_interval=0.05),
        connection=Connection(backoff_max=0.3),
        fail_open=FailOpen(clock_retry_initial=0.05, clock_retry_max=0.2),
    )
    first_state, first_reason = client.clock_control, client.clock_control_reason
    clocks = (1200, 1005)
    client.use_plan(
        PlanUpdate(1, tuple(PlanStep(k, m, clocks[i % 2], 0) for i, (k, m) in enumerate(ORDER)))
    )
    it, active_iterations = 0, 0
    deadline = time.monotonic() + 60.0
    while (it < args.iterations and not (args.stop_file and os.path.exists(args.stop_file))) or (
        args.until_active and active_iterations < 2 and time.monotonic() < deadline
    ):
        with client.iteration():
            for kind, mb in ORDER:
                with client.instruction(kind, microbatch=mb):
                    time.sleep(args.instruction_seconds)
        state = client.clock_control
        active_iterations = active_iterations + 1 if state == "active" else 0
        progress.write(f"{it} {state}\n")
        it += 1
    summary = {
        "iterations": it,
        "first_state": first_state,
        "first_reason": first_reason,
        "last_state": client.clock_control,
        "last_reason": client.clock_control_reason,
        "recoveries": client.gpu.recoveries,
        "max_clock": client.max_clock,
        "reports_sent": client.link.reports_sent,
        "duplicates": client.link.duplicates,
    }
    client.link.flush(timeout=5.0)
    client.close()
    with out:
        json.dump(summary, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
