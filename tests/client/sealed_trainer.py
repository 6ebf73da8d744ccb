"""A rank whose package tree becomes unreadable once it has imported the client.

A launcher may import the client, then drop privileges (or enter a sandbox) before it constructs
one: from then on, nothing under a directory only its owner may enter can be imported, such as a
``.venv`` inside a 0700 home directory. This program imports ``perseus_client`` as a trainer
does, then records every import attempted after that point (it lets them load, so the run
finishes and the test sees them all), and runs one connected rank against a real server: the
plan push, the clock changes and the iteration reports. It prints one JSON object: the modules
imported late and what the rank saw.

Usage: ``python sealed_trainer.py TARGET JOB TOKEN``.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
import time
from typing import Any

from client_data import PROFILE

from perseus_client import (
    Connection,
    PerseusClient,
    RankPosition,
    RecordingGpu,
    Reporting,
    SimulatedGpu,
)

LATE: list[str] = []


class _Recorder(importlib.abc.MetaPathFinder):
    """Notes every module loaded from a file from now on (it finds nothing itself).

    A module that does not exist (``msvcrt`` here) or that is built into the interpreter needs
    no file, so a sealed tree would not fail it.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.origin not in ("built-in", "frozen"):
                    LATE.append(fullname)
                break
        return None


def main() -> int:
    target, job, token = sys.argv[1:4]
    gpu = RecordingGpu(SimulatedGpu(PROFILE, stage=0, time_scale=0))
    sys.meta_path.insert(0, _Recorder())
    client = PerseusClient(
        target,
        job,
        gpu=gpu,
        token=token,
        handle_signals=False,
        rank=RankPosition(global_rank=0, pipeline_rank=0),
        reporting=Reporting(report_interval=0.05),
        connection=Connection(backoff_max=0.3),
    )
    deadline = time.monotonic() + 60
    while client.latest_plan is None and time.monotonic() < deadline:
        time.sleep(0.05)
    plan = client.latest_plan
    order = [] if plan is None else [(s.instruction, s.microbatch, s.stage) for s in plan.steps]
    for _ in range(3):
        with client.iteration():
            for kind, mb, stage in order:
                with client.instruction(kind, microbatch=mb, stage=stage):
                    pass
    client.link.flush(timeout=10.0)
    summary = {
        "late_imports": sorted(set(LATE)),
        "plan_version": client.plan_version,
        "steps": len(order),
        "clocks_set": len(gpu.instructions),
        "reports_sent": client.link.reports_sent,
        "connected": client.connected,
    }
    client.close()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
