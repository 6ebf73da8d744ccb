"""Record what a real server sends: plan messages' bytes, plan JSON and ``/openapi.json``.

For structure changes that must keep behaviour and wire bytes: run it in the tree before and
after the change, then compare the two folders file by file (``cmp``)::

    .venv/bin/python scripts/capture_wire.py /tmp/before     # in the tree before
    .venv/bin/python scripts/capture_wire.py /tmp/after      # in the tree after
    for f in /tmp/before/*; do cmp "$f" /tmp/after/$(basename "$f"); done

It starts ``perseus serve`` on free ports (a fresh SQLite file), solves a 2-stage, 4-microbatch
1F1B job on the A40 profile cut to 6 clocks with 2 pipelines, and writes: ``openapi.json``;
``plan_*.json`` (``GET /jobs/{id}/plan`` by index, slowdown, with and without steps, and an
index out of range); ``deploy_*.json`` (``PUT /jobs/{id}/plan``); and ``watch_*.bin``, the
serialized ``PlanUpdate`` each of the 4 ranks' ``WatchPlan`` stream sends first at max clocks,
after a slowdown deployment and after pinning one pipeline. Ids and timestamps are left out of
the JSON so that two runs of the same code give the same files.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import httpx

from perseus.profiles import load_profile
from perseus_common.proto import perseus_pb2 as pb
from perseus_common.proto import perseus_pb2_grpc as pb_grpc
from perseus_server import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "gpt3-175b_a40_8stage.csv"
#: Keys that differ from run to run.
VOLATILE = {"id", "job_id", "rank_id", "created", "updated", "created_at", "updated_at"}
VOLATILE |= {"timestamp", "started_at", "finished_at", "elapsed", "solve_seconds", "deployed_at"}
QUERIES = {
    "idx0": {"index": 0, "steps": True},
    "slow10": {"slowdown": 0.10, "steps": True},
    "last": {"index": -1, "steps": True},
    "nosteps": {"slowdown": 0.05},
}
DEPLOYS = {"slow10": {"slowdown": 0.10}, "pipe1": {"slowdown": 0.2, "pipelines": [1]}}


def small_csv() -> str:
    """The A40 profile cut to 2 stages and every 10th clock."""
    p = load_profile(PROFILE)
    keep = set(p.frequencies[::10])
    rows = [r for r in p.records() if r["stage"] < 2 and r["frequency"] in keep]
    head = "stage,instruction,frequency,time,energy\n"
    return head + "".join(
        f"{r['stage']},{r['instruction']},{r['frequency']},{r['time']!r},{r['energy']!r}\n"
        for r in rows
    )


def stable(doc: Any) -> Any:
    """``doc`` without the keys that differ from run to run."""
    if isinstance(doc, dict):
        return {k: stable(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [stable(x) for x in doc]
    return doc


def solved_job(http: httpx.Client) -> str:
    """A job with its frontier computed."""
    body = {"stages": 2, "microbatches": 4, "schedule": "1f1b", "blocking_power": 70.38}
    job = str(
        http.post("/jobs", json={**body, "gpu_model": "A40", "data_parallel": 2}).json()["id"]
    )
    put = http.put(
        f"/jobs/{job}/profile", content=small_csv(), headers={"content-type": "text/csv"}
    )
    put.raise_for_status()
    http.post(f"/jobs/{job}/frontier").raise_for_status()
    for _ in range(6000):
        status = http.get(f"/jobs/{job}/frontier", params={"points": False}).json()
        if status["status"] == "done":
            return job
        if status["status"] == "failed":
            raise RuntimeError(f"the frontier failed: {status}")
        time.sleep(0.1)
    raise RuntimeError("the frontier did not finish in 600 s")


def capture(out: Path) -> None:
    """Run a server and write every file into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(Path(tmp) / "p.db") as srv:
        http = httpx.Client(base_url=srv.http_url, timeout=60)
        (out / "openapi.json").write_bytes(http.get("/openapi.json").content)
        job = solved_job(http)
        for name, params in QUERIES.items():
            r = http.get(f"/jobs/{job}/plan", params=params)
            text = json.dumps(stable(r.json()), indent=1)
            (out / f"plan_{name}.json").write_text(f"{text}\n{r.status_code}\n")
        stub = pb_grpc.PlanServiceStub(grpc.insecure_channel(srv.grpc_target))
        ranks = [
            stub.RegisterRank(
                pb.RegisterRankRequest(
                    job_id=job, global_rank=g, pipeline_rank=g % 2, data_rank=g // 2,
                    gpu_name="NVIDIA A40", hostname="capture",
                ),
                timeout=10,
            ).rank_id
            for g in range(4)
        ]  # fmt: skip

        def watch(tag: str) -> None:
            for i, rank in enumerate(ranks):
                call = stub.WatchPlan(pb.WatchPlanRequest(job_id=job, rank_id=rank), timeout=20)
                (out / f"watch_{tag}_{i}.bin").write_bytes(next(call).SerializeToString())
                call.cancel()

        watch("max")
        for tag, body in DEPLOYS.items():
            r = http.put(f"/jobs/{job}/plan", json=body)
            text = json.dumps(stable(r.json()), indent=1)
            (out / f"deploy_{tag}.json").write_text(f"{text}\n{r.status_code}\n")
            watch(tag)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    capture(Path(sys.argv[1]))
    print("written:", sys.argv[1])
