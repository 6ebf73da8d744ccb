"""Shared pieces of the integration tests.

Profile slices, simulated GPUs, the REST calls that set a job up on a real ``perseus serve``, and
the result files rank processes write.

Imported both by the pytest modules and by the rank worker scripts (run as separate processes).
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PROFILE = REPO / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
BLOCKING_POWER = 83.64
#: A few A100 clocks: enough for the frontier to have distinct plans, few enough to solve at once.
FREQUENCIES = (1410, 1305, 1200, 1110, 1005, 900)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def profile_slice(stages: int, frequencies: tuple[int, ...] = FREQUENCIES) -> str:
    """CSV text of the A100 GPT-3 profile restricted to some stages and a few clocks.

    The stages are model stages ``0..stages-1``; the profile has 8 stages, and more model stages
    reuse them cyclically.
    """
    rows = list(csv.DictReader(PROFILE.read_text().splitlines()))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["stage", "instruction", "frequency", "time", "energy"])
    writer.writeheader()
    for stage in range(stages):
        for row in rows:
            if int(row["stage"]) == stage % 8 and int(row["frequency"]) in frequencies:
                writer.writerow({**row, "stage": stage})
    return out.getvalue()


def simulated_gpu(profile_csv: str, stages: list[int], log_path: Path | None = None) -> Any:
    """A recording, non-sleeping ``SimulatedGpu`` for the model stages one rank runs.

    The profile has forward/backward only; backward_input/backward_weight take half of backward
    each, as ``perseus.problem`` assumes for zero-bubble schedules.
    """
    from perseus_client import RecordingGpu, SimulatedGpu, read_profile_csv

    data = read_profile_csv(profile_csv, stages=stages)
    for stage in stages:
        backward = data[(stage, "backward")]
        half = {f: (t / 2, e / 2) for f, (t, e) in backward.items()}
        data[(stage, "backward_input")] = dict(half)
        data[(stage, "backward_weight")] = dict(half)
    sim = SimulatedGpu(data, stage=stages[0], blocking_power=BLOCKING_POWER, time_scale=0.0)
    return RecordingGpu(sim, log_path=log_path)


class ServerApi:
    """The REST calls a launcher makes to set a job up: create, profile, solve, deploy."""

    def __init__(self, http_url: str, token: str | None = None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=http_url, headers=headers, timeout=30.0)

    def close(self) -> None:
        self.http.close()

    def _ok(self, response: Any) -> Any:
        if response.status_code >= 400:
            raise RuntimeError(
                f"{response.request.method} {response.request.url}: {response.status_code} {response.text}"
            )
        return response.json() if response.content else None

    def create_job(self, orders: list[list[list[Any]]], name: str) -> str:
        microbatches = 1 + max(op[1] for order in orders for op in order)
        body = {
            "name": name,
            "stages": len(orders),
            "microbatches": microbatches,
            "schedule": {"name": "custom", "orders": orders},
            "blocking_power": BLOCKING_POWER,
        }
        return str(self._ok(self.http.post("/jobs", json=body))["id"])

    def solve(self, job: str, model_stages: int, timeout: float = 120.0) -> None:
        self._ok(
            self.http.put(
                f"/jobs/{job}/profile",
                content=profile_slice(model_stages).encode(),
                headers={"Content-Type": "text/csv"},
            )
        )
        self._ok(self.http.post(f"/jobs/{job}/frontier"))
        deadline = time.monotonic() + timeout
        while True:
            doc = self._ok(self.http.get(f"/jobs/{job}/frontier"))
            status = doc.get("status")
            if status in ("done", "ready", "completed"):
                return
            if status in ("failed", "cancelled"):
                raise RuntimeError(f"frontier of job {job}: {doc}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"frontier of job {job} not ready: {doc}")
            time.sleep(0.1)

    def deploy(self, job: str, slowdown: float) -> int:
        """Deploy the least-energy plan within ``slowdown``; return the plan version."""
        doc = self._ok(self.http.put(f"/jobs/{job}/plan", json={"slowdown": slowdown}))
        return int(doc.get("version", doc.get("plan_version", 0)))

    def plan_steps(self, job: str, slowdown: float) -> list[list[dict[str, Any]]]:
        doc = self._ok(
            self.http.get(f"/jobs/{job}/plan", params={"slowdown": slowdown, "steps": True})
        )
        return list(doc["steps"])


def wait_for_plan(client: Any, version: int, timeout: float = 60.0) -> Any:
    """Block until ``client`` has received plan ``version`` (it is used from the next iteration)."""
    deadline = time.monotonic() + timeout
    while True:
        plan = client.latest_plan
        if plan is not None and plan.version >= version:
            return plan
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank never received plan version {version} (has {plan})")
        time.sleep(0.02)


def write_result(out_dir: Path, name: str, rank: int, doc: dict[str, Any]) -> None:
    path = out_dir / f"{name}.rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def read_results(out_dir: Path, name: str, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((out_dir / f"{name}.rank{r}.json").read_text()) for r in range(ranks)]


def rank_environment(port: int) -> dict[str, str]:
    """Environment for a rank subprocess: repo on the path, no GPU, quiet libraries."""
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        DS_ACCELERATOR="cpu",
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def plan_ops(plan: Any) -> list[list[Any]]:
    return [[s.instruction, s.microbatch, s.stage] for s in plan.steps]


def executed(gpu: Any) -> list[list[Any]]:
    """What the recording GPU saw: ``[kind, microbatch, stage, mhz]`` per instruction."""
    return [[r.kind, r.microbatch, r.stage, r.mhz] for r in gpu.instructions]


if __name__ == "__main__":  # pragma: no cover - manual inspection
    sys.stdout.write(profile_slice(int(sys.argv[1]) if len(sys.argv) > 1 else 2))


def launch_ranks(
    script: Path,
    world: int,
    config: dict[str, Any],
    out: Path,
    timeout: float = 240.0,
    pythonpath: str | None = None,
) -> None:
    """Run ``world`` copies of ``script`` over gloo to completion, from the script's directory.

    Each copy gets ``--rank r --world w --config --out``; ``pythonpath`` goes before the ranks'
    own path. Fails the calling test with every rank's output tail.
    """
    import subprocess

    import pytest

    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "config.json"
    cfg.write_text(json.dumps(config))
    env = rank_environment(free_port())
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env["PYTHONPATH"]])
    logs = [out / f"rank{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        argv = [sys.executable, str(script), "--rank", str(r), "--world", str(world)]
        with open(logs[r], "wb") as log:
            procs.append(
                subprocess.Popen(
                    [*argv, "--config", str(cfg), "--out", str(out)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(script.parent),
                )
            )
    codes = []
    try:
        for proc in procs:
            codes.append(proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if codes != [0] * world:
        tails = "\n".join(
            f"--- rank {r} (exit {procs[r].returncode}) ---\n"
            + logs[r].read_text(errors="replace")[-4000:]
            for r in range(world)
        )
        pytest.fail(f"{script.name} ranks failed:\n{tails}")


def run_ranks(
    script: str, world: int, config: dict[str, Any], out: Path, timeout: float = 240.0
) -> None:
    """Run ``world`` copies of ``script`` (one per rank) to completion; fail with their output."""
    launch_ranks(Path(__file__).resolve().parent / script, world, config, out, timeout)
