"""Zeus's real, unmodified ``PipelineFrequencyOptimizer`` trains under a real ``perseus serve --zeus``.

Rank processes over gloo (``zeus_worker.py``) train two iterations of a 2-stage pipeline, a
4-stage one and a 2-stage one with data parallelism 2, with only Zeus's GPU faked (its GPU slot,
recording the clocks Zeus's forked frequency controller locks) and CUDA calls made no-ops. The
server requires tokens, so the client's ``server_url`` carries a ``zeus`` credential
(``/zeus/<credential>``). Checked: every rank ran the schedule it got, the schedule is the plan
Perseus deployed for the run's job (its REST plan), and the controller locked exactly those
clocks, in order, each one the GPU offers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
# The dev extra installs Zeus (pyproject.toml): a missing one fails here, never skips, so CI
# cannot pass without running Zeus's real client.
import zeus.optimizer.pipeline_frequency  # noqa: E402, F401
from integration_harness import (  # noqa: E402
    BLOCKING_POWER,
    FREQUENCIES,
    free_port,
    profile_slice,
    rank_environment,
    read_results,
)
from zeus_fake_gpu import MEMORY_CLOCKS, read_calls  # noqa: E402

from perseus_server.testing.process import ServerProcess  # noqa: E402

pytestmark = pytest.mark.slow

ADMIN = "zeus-e2e-admin-token"
TENANT = "team-zeus"
#: The fake GPU's clocks: the profile's and two it does not use (the fastest among them).
CLOCKS = sorted({1500, *FREQUENCIES, 810}, reverse=True)
MICROBATCHES = 4
WORKER = Path(__file__).resolve().parent / "zeus_worker.py"


def _ok(r: httpx.Response) -> Any:
    assert r.status_code < 300, f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text}"
    return r.json() if r.content else None


def _prototype(admin: httpx.Client, name: str, stages: int, slowdown: float | None) -> str:
    """A solved prototype job of the tenant (with a slowed-down plan policy when given)."""
    body = {
        "name": name,
        "tenant": TENANT,
        "stages": stages,
        "microbatches": MICROBATCHES,
        "blocking_power": BLOCKING_POWER,
    }
    job = _ok(admin.post("/jobs", json=body))["id"]
    csv = profile_slice(stages).encode()
    _ok(admin.put(f"/jobs/{job}/profile", content=csv, headers={"Content-Type": "text/csv"}))
    _ok(admin.post(f"/jobs/{job}/frontier"))
    for _ in range(1200):
        if _ok(admin.get(f"/jobs/{job}/frontier", params={"points": False}))["status"] == "done":
            break
        time.sleep(0.1)
    if slowdown is not None:
        _ok(admin.put(f"/jobs/{job}/plan", json={"slowdown": slowdown}))
    return str(job)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("zeus-e2e")
    args = ["--zeus", "--zeus-default-prototype", "proto4"]
    with (
        ServerProcess(d / "perseus.db", token=ADMIN, extra_args=args) as srv,
        httpx.Client(
            base_url=srv.http_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60
        ) as admin,
    ):
        _ok(admin.post("/tenants", json={"id": TENANT}))
        secret = _ok(admin.post("/credentials", json={"scope": "zeus", "tenant": TENANT}))
        yield {
            "srv": srv,
            "admin": admin,
            "url": f"{srv.http_url}/zeus/{secret['credential']}",
            "secret": secret["credential"],
            "proto2": _prototype(admin, "proto2", 2, slowdown=1.15),
            "proto4": _prototype(admin, "proto4", 4, slowdown=None),
        }
        assert secret["credential"] not in srv.output()  # never logged


def _launch(world: int, config: dict[str, Any], out: Path) -> None:
    """Run the ``world`` ranks (``zeus_worker.py`` forks them) to completion; fail with their logs."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "config.json"
    cfg.write_text(json.dumps(config))
    argv = [sys.executable, str(WORKER), "--world", str(world), "--config", str(cfg)]
    proc = subprocess.run(
        [*argv, "--out", str(out)],
        env=rank_environment(free_port()),
        cwd=str(WORKER.parent),
        capture_output=True,
        timeout=300,
    )
    if proc.returncode != 0:
        logs = "\n".join(
            f"--- rank {r} ---\n" + (out / f"rank{r}.log").read_text(errors="replace")[-3000:]
            for r in range(world)
            if (out / f"rank{r}.log").exists()
        )
        pytest.fail(f"zeus ranks failed: {proc.stdout.decode()}{proc.stderr.decode()}\n{logs}")


def _dedup(clocks: list[int]) -> list[int]:
    out: list[int] = []
    for c in clocks:
        if not out or out[-1] != c:
            out.append(c)
    return out


def _check_clocks(out: Path, rank: int, result: dict[str, Any]) -> None:
    """The controller locked exactly the schedule's clocks, in order, then reset the GPU."""
    calls = read_calls(out / f"clocks.rank{rank}.jsonl")
    locks = [c for c in calls if c["call"] == "set_gpu_locked_clocks"]
    schedule = [mhz for _, mhz in result["schedule"]]
    # Zeus's controller starts at the fastest clock, then locks each change (two iterations).
    assert [c["args"] for c in locks] == [[f, f] for f in _dedup([CLOCKS[0], *schedule * 2])]
    assert all(c["pid"] != result["pid"] for c in locks)  # from its forked controller
    top = max(MEMORY_CLOCKS)
    assert {"call": "set_memory_locked_clocks", "args": [top, top]} in [
        {k: c[k] for k in ("call", "args")} for c in calls
    ]
    assert calls[-1]["call"] == "reset_gpu_locked_clocks"


def _check_plan(admin: httpx.Client, results: list[dict[str, Any]], dp: int) -> str:
    """Each rank's schedule is its pipeline's stage of the plan deployed for the run's job."""
    run = results[0]["job_id"]
    assert all(r["job_id"] == run for r in results)
    status = _ok(admin.get(f"/jobs/{run}/status"))
    plan = status["plan"]
    assert plan["kind"] == "plan" and len(plan["pipelines"]) == dp, plan
    for r in results:
        index = plan["pipelines"][r["dp_rank"]]["index"]
        doc = _ok(admin.get(f"/jobs/{run}/plan", params={"index": index, "steps": True}))
        steps = doc["steps"][r["pp_rank"]]
        assert r["schedule"] == [[s["instruction"], s["frequency"]] for s in steps]
        assert all(mhz in CLOCKS for _, mhz in r["schedule"])
        assert r["ran"] == [[name for name, _ in r["schedule"]]] * 2
    return str(run)


@pytest.mark.parametrize(
    ("pp", "dp", "metadata"),
    [(2, 1, "proto2"), (4, 1, None), (2, 2, "id:proto2")],
    ids=["2-stage", "4-stage-default-prototype", "2-stage-dp2"],
)
def test_zeus_client_trains_on_perseus_plans(
    setup: dict[str, Any], tmp_path: Path, pp: int, dp: int, metadata: str | None
) -> None:
    if metadata is not None and metadata.startswith("id:"):
        metadata = setup[metadata[3:]]  # the prototype named by its id
    config = {
        "server_url": setup["url"],
        "pp": pp,
        "dp": dp,
        "microbatches": MICROBATCHES,
        "metadata": metadata,
        "clocks": CLOCKS,
    }
    _launch(pp * dp, config, tmp_path)
    results = read_results(tmp_path, "zeus", pp * dp)
    admin = setup["admin"]
    run = _check_plan(admin, results, dp)
    for rank, result in enumerate(results):
        _check_clocks(tmp_path, rank, result)
    job = _ok(admin.get(f"/jobs/{run}"))
    prototype = setup["proto2" if pp == 2 else "proto4"]
    assert job["tenant"] == TENANT and job["data_parallel"] == dp
    assert job["profile"]["source"] == f"zeus prototype {prototype}", job["profile"]
    frontier = _ok(admin.get(f"/jobs/{run}/frontier", params={"points": False}))
    assert frontier["status"] == "done" and frontier["solve_seconds"] == 0.0  # not solved again
    if pp == 2:  # the prototype's policy (slowdown 1.15): some instruction below the top clock
        assert min(mhz for r in results for _, mhz in r["schedule"]) < max(FREQUENCIES)
        assert _ok(admin.get(f"/jobs/{run}/status"))["plan"]["policy"]["kind"] == "slowdown"


def test_the_client_raises_the_servers_refusal_at_start(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    config = {
        "server_url": setup["url"],
        "pp": 1,
        "dp": 1,
        "microbatches": 2,
        "metadata": "no-such-prototype",
        "clocks": CLOCKS,
        "expect_error": True,
    }
    _launch(1, config, tmp_path)
    error = read_results(tmp_path, "zeus", 1)[0]["error"]
    assert "PFO server returned status code 422" in error
    assert "no job named 'no-such-prototype'" in error and "job_metadata" in error
    assert setup["secret"] not in error
