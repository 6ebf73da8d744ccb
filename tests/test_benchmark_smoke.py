"""Every benchmark's ``--smoke`` mode runs to the end and prints figures that make sense.

So a benchmark that breaks fails the suite (``benchmarks/client.py`` has its own test in
``tests/client/test_benchmark_client.py``; ``status_load``/``server`` and ``communication`` theirs).

Each runs as a subprocess, as a user would run it; the checks read its table or JSON, never its
timings against a limit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(script: str, *args: str, timeout: float = 300.0) -> str:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, f"{script} {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.slow
def test_hooks_benchmark_smoke() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    res: dict[str, Any] = json.loads(run("hooks.py", "--smoke", "--json"))
    assert set(res) == {"torch", "deepspeed", "megatron"}
    for name, r in res.items():
        assert r["iterations"] == 3, name
        assert r["clocks_match_plan"] is True, f"{name}: the GPU did not run the plan's clocks"
        assert r["instructions_per_iteration"] > 0
        assert r["iteration_boundary_us_median"] > 0
        assert r["hook_us_p99"] >= r["hook_us_median"] - r["timer_floor_us"]
        assert r["step_ms_hooked_median"] > 0
        # The paired phase: 4 pairs, the median excess inside its interval.
        assert r["pairs"] == 4
        lo, hi = r["step_excess_us_per_instruction_ci95"]
        assert lo <= r["step_excess_us_per_instruction_median"] <= hi
    # 4 microbatches; torch: rank 0 holds stages 0 and 2 of 4, so its 3 boundaries (0, 1, 2)
    # are all to the other rank: 3 links x 2 directions x 4 microbatches.
    assert res["torch"]["instructions_per_iteration"] == 2 * 2 * 4
    assert res["torch"]["transfers_recorded_per_iteration"] == 24
    # DeepSpeed, 2 stages: stage 0 sends 4 activations and receives 4 gradients.
    assert res["deepspeed"]["instructions_per_iteration"] == 8
    assert res["deepspeed"]["transfers_recorded_per_iteration"] == 8
    # Megatron's schedules need CUDA for P2P: none on CPU.
    assert res["megatron"]["transfers_recorded_per_iteration"] == 0


def test_solver_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "solver.json"
    text = run("solver.py", "--smoke", "--json", str(out))
    assert "A100  8 stages x 4 microbatches" in text
    (row,) = json.loads(out.read_text())["results"]
    assert re.search(r"fastest plan: true T vs T0\s+\+0\.000 %", text), text
    assert (row["gpu"], row["microbatches"]) == ("a100", 4) and row["T0"] > 0 and row["E0"] > 0
    assert row["perseus"]["wall"] > 0 and row["lowtime"] == {}  # --smoke: lowtime not run
    gaps = re.findall(r"gap to lower bound at [\d.]+ T0\s+([\d.]+) %", text)
    assert len(gaps) == 4 and all(float(g) <= 0.5 for g in gaps)
    savings = [float(x) for x in re.findall(r"saving at [\d.]+ T0\s+([\d.]+) %", text)]
    assert len(savings) == 4 and savings == sorted(savings) and savings[0] > 0


def test_power_benchmark_smoke() -> None:
    text = run("power.py", "--smoke")
    rows = [line for line in text.splitlines() if line.startswith("| A100 8×4 |")]
    assert len(rows) == 5  # one per budget
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        perseus, bound, gap = float(cells[3]), float(cells[5]), float(cells[6])
        assert perseus >= bound - 1e-9 and gap >= 0  # the bound certifies Perseus's choice
        assert perseus <= float(cells[7].split()[0]) + 1e-9  # no slower than a power limit
        assert cells[-1] == "yes"


def test_lowtime_runner_smoke() -> None:
    pytest.importorskip("lowtime")
    text = run("lowtime_runner.py", "--smoke")
    assert "8 stages x 2 microbatches" in text
    plans = re.search(r"plans: (\d+)\s+completed: (True|False)", text)
    assert plans and int(plans.group(1)) > 1
    ratios = [float(x) for x in re.findall(r"true T/T0 = ([\d.]+)", text)]
    assert len(ratios) == 2 and ratios[0] >= 1.0 - 1e-9 and ratios[1] >= ratios[0]


@pytest.mark.slow
def test_soak_smoke() -> None:
    text = run("soak.py", "--smoke")
    assert "soak: 8 s, 16 ranks in 1 processes" in text
    served = re.search(r", (\d+) reports \(", text)
    assert served and int(served.group(1)) > 0, text
    lost = re.search(r"acknowledged but lost after SIGKILL \+ restart: (\d+) of (\d+) ranks", text)
    assert lost and lost.group(1) == "0" and int(lost.group(2)) > 0, text
    memory = re.findall(r"^\s+\d+ s\s+([\d.]+)$", text, re.M)
    assert len(memory) >= 2 and all(float(m) > 0 for m in memory)


@pytest.mark.slow
def test_soak_failover_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (initdb / pg_ctl; Debian package postgresql)")
    res: dict[str, Any] = json.loads(run("soak.py", "--failover", "--smoke", "--json"))
    rows = res["rounds"]
    assert [r["fault"] for r in rows] == ["SIGKILL", "SIGSTOP"]
    assert all(r["lost"] == 0 and r["acked"] > 0 for r in rows), rows
    assert all(r["ranks_with_plan"] == r["ranks"] == 16 for r in rows), rows
    assert [r["version_went_back"] for r in rows] == [0, 0]
    # The restarted server leads the second round: versions go on from the first's.
    assert rows[1]["deployed_version"] > rows[0]["deployed_version"]
    assert res["two_leaders_in_an_epoch"] == 0 and len(res["commits_by_epoch"]) == 3


def test_store_benchmark_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    res: dict[str, Any] = json.loads(run("store.py", "--smoke", "--json"))
    assert (res["ranks"], res["reports_per_rank"]) == (32, 5)
    stores = ["sqlite"] + (
        ["postgresql", "postgresql-on-loop"] if postgres_binaries() is not None else []
    )
    for name in stores:
        r = res[name]
        assert r["reports"] == 160 and r["reports_per_s"] > 0, name
        assert 0 < r["ack_ms_p50"] <= r["ack_ms_p99"], name
    if "postgresql" in res:
        # One commit per report on the loop; the writer groups the reports that wait together.
        assert res["postgresql-on-loop"]["commits"] == 160
        assert res["postgresql"]["commits"] < 160


@pytest.mark.slow
def test_failover_benchmark_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (initdb / pg_ctl; Debian package postgresql)")
    res: dict[str, Any] = json.loads(run("failover.py", "--smoke", "--json"))
    rows = res["rounds"]
    assert [r["fault"] for r in rows] == ["SIGKILL", "SIGSTOP", "dbcut"]
    for r in rows:
        assert r["acked"] > 0 and r["lost"] == 0, r
        assert r["version_went_back"] == 0 and r["deployed_version"] >= 2, r
        # Every rank got a plan on its stream to the new leader, after it had taken over.
        assert r["ranks_with_plan"] == r["ranks"] == 16, r
        # (the ports listen a moment before /healthz is seen to answer: ready is not a bound)
        assert 0 < r["to_leader_s"] <= min(r["to_ready_s"], r["plans_max_s"]), r
    # A hung or cut-off leader stops itself once it knows it was deposed.
    assert [r["deposed_exit"] for r in rows] == [None, 3, 3]
    # One committing server per epoch: the first leader's and one per failover.
    assert len(res["commits_by_epoch"]) == 4 and res["two_leaders_in_an_epoch"] == 0


@pytest.mark.slow
def test_tenancy_benchmark_smoke() -> None:
    """The starvation scenario (issue #31).

    Tenant A's slowdown stays 0 while tenant B's jobs are created, solved and never started, and
    once A is guaranteed its watts.
    """
    rows: list[dict[str, Any]] = json.loads(run("tenancy.py", "--smoke", "--json"))
    assert [r["step"][0] for r in rows] == ["0", "1", "2", "3", "4"]
    for r in (rows[0], rows[1], rows[2], rows[4]):
        assert r["A"]["slowdown"] == 0.0 and r["A"]["drawing"], r
    for r in (rows[1], rows[2]):  # never started: they draw nothing, the budget is met
        assert r["feasible"] and not r["B-1024"]["drawing"], r
    assert not rows[2]["B-10kW"]["drawing"]
    # Started, B's 10 kW-per-GPU claim counts as what its two A40s can draw (300 W each).
    assert "2-GPU job claims 10 kW/GPU" in rows[2]["step"]
    assert rows[3]["B-10kW"]["watts"] <= 600.0 + 1e-6
    assert rows[3]["A"]["slowdown"] > 0  # equal weights, no guarantee: A gives up half


@pytest.mark.slow
def test_tenant_fairness_benchmark_smoke() -> None:
    """Fairness between tenants (issue #39): what team B's credential does to team A."""
    out: dict[str, Any] = json.loads(run("tenant_fairness.py", "--smoke", "--json", timeout=900))
    churn = out["churn"]
    assert churn["redeploys"] <= 1 + 2 * (churn["seconds"] / 0.5 + 1), churn  # merged, not 10
    assert churn["received"] <= churn["redeploys"] + 1, churn
    phantom = out["phantom"]
    assert phantom["a_after"] == phantom["a_before"] and phantom["b_demand"] == 0.0, phantom
    assert out["backlog"]["a_answer"] == 202, out["backlog"]
    assert out["quota"]["fifth_first_job"] == 201, out["quota"]
    assert out["streams"]["open"] == out["streams"]["cap"], out["streams"]
    writes = out["writes"]
    assert writes["a_write"] == 201 and writes["refused_429"] > 0, writes


@pytest.mark.slow
def test_hostile_server_benchmark_smoke() -> None:
    rows: dict[str, Any] = json.loads(run("hostile_server.py", "--smoke", "--json"))
    selection = rows["stage selection, 6 ranges of 100,000"]
    assert selection["status"] == 422 and selection["field"] == "stages"
    flood = rows["2 + 1 reports of 10000 transfers"]
    assert flood["one_report"].startswith("INVALID_ARGUMENT: transfers:")
    framed = rows["a rank times a link it does not end"]["rank 0 times boundary 2"]
    assert framed.startswith("INVALID_ARGUMENT: transfers.boundary:")
    token = rows["token file swapped for a link to another user's 0600 file"]
    assert token.get("skipped") or token == {"old token": 200, "the other user's token": 401}
    disk = rows["database on a full 3 MiB file system"]
    if not disk.get("skipped"):
        assert disk["POST /jobs"].startswith("503 Retry-After=")
        assert disk["ReportIterations"].startswith("UNAVAILABLE")
        assert disk["after space returns"] == 201
    assert rows["wall clock stepped back 3600 s"] == {
        "state 3 s after the last rank left, after a -3600 s step": "idle"
    }


@pytest.mark.slow
def test_link_noise_benchmark_smoke() -> None:
    pytest.importorskip("torch")
    res: dict[str, Any] = json.loads(run("link_noise.py", "--smoke", "--json"))
    assert set(res["links"]) == {"0/forward", "0/backward"}
    for link, r in res["links"].items():
        assert len(r["per_clock_ms"]) == 2 and r["fit_ms"] > 0, link
        # Two clocks: too few for the slope test, so one time whatever the steps measured.
        assert r["fit"] == "one time" and r["old_per_clock"] is True, link


@pytest.mark.slow
def test_profiling_benchmark_transfers_smoke() -> None:
    pytest.importorskip("torch")
    out = run("profiling.py", "--smoke")
    rows = re.findall(
        r"^A100 2x2\s+(none|fitted|per clock)\s+((?:-?\d+\.\d+ / ){3}-?\d+\.\d+)\s+"
        r"((?:-?\d+\.\d+ / ){3}-?\d+\.\d+)\s+(\d+\.\d+)",
        out,
        re.M,
    )
    assert [r[0] for r in rows] == ["none", "fitted", "per clock"], out
    for variant, got, truth, diff in rows:
        got_pts = [float(x) for x in got.split(" / ")]
        true_pts = [float(x) for x in truth.split(" / ")]
        # The printed difference is the largest over the four deadlines.
        largest = max(abs(a - b) for a, b in zip(got_pts, true_pts, strict=True))
        assert abs(float(diff) - largest) <= 0.011, variant
    links = re.findall(
        r"link 0/(\w+)\s+truth (\d+\.\d+) ms; per-clock medians (\d+\.\d+)-(\d+\.\d+) ms; "
        r"z (\S+) -> (per clock|one time (\d+\.\d+) ms)",
        out,
    )
    assert sorted(link[0] for link in links) == ["backward", "forward"], out
    for _, truth, lo, hi, _z, _fit, one in links:
        assert float(truth) > 0 and float(lo) <= float(hi)
        if one:  # one time: the median of every sample, so within the per-clock medians
            assert float(lo) - 0.001 <= float(one) <= float(hi) + 0.001


@pytest.mark.slow
def test_hooks_benchmark_async_gpu_smoke() -> None:
    """``--gpu async``: clock locks on the controller thread, the plan's clocks still requested."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    args = ("--smoke", "--json", "--gpu", "async", "--integration", "megatron")
    res: dict[str, Any] = json.loads(run("hooks.py", *args))
    r = res["megatron"]
    assert r["iterations"] == 3 and r["pairs"] == 4
    assert r["clocks_match_plan"] is True
    assert r["hook_us_p99"] >= r["hook_us_median"] - r["timer_floor_us"]


@pytest.mark.slow
def test_server_queries_and_push_smoke() -> None:
    """``benchmarks/server.py --smoke --baseline .`` runs against itself as the baseline.

    This tree's server and the same tree run as the baseline (from its sources, by
    ``PYTHONPATH``), each solved, queried and pushed to.
    """
    out = run("server.py", "--smoke", "--baseline", str(ROOT))
    rows = dict(
        re.match(r"(\S+: .+?)  +(.+)$", line).groups()  # type: ignore[union-attr]
        for line in out.splitlines()[1:]
    )
    for name in ("this", "baseline"):
        assert re.match(r"\d+ points, job \w+$", rows[f"{name}: frontier"])
        queries = [v for k, v in rows.items() if k.startswith(f"{name}: GET /plan")]
        assert len(queries) == 2, rows
        for q in queries:
            m = re.match(r"(\d+) req/s, p50 ([\d.]+) ms, p99 ([\d.]+) ms \((\d+) requests\)", q)
            assert m, q
            assert int(m.group(4)) > 0 and float(m.group(2)) <= float(m.group(3))
        push = rows[f"{name}: push to 16 WatchPlan streams (1 client processes)"]
        assert re.match(
            r"median \d+ ms, max \d+ ms over 1 deployments \(server wrote all within [\d.]+ ms\); "
            r"0 calls retried after CANCELLED; "
            r"load ",
            push,
        ), push


def test_swing_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "swing.json"
    text = run("swing.py", "--smoke", "--json", str(out))
    assert "A100 8 x 4" in text
    (row,) = json.loads(out.read_text())["results"]
    assert row["meets"] is True
    assert row["after"]["swing"] <= 0.30 + 1e-6
    assert row["after"]["change_100ms"] <= 0.12 * row["after"]["peak"] * (1 + 1e-6)
    # Plan and floors together never cost more than the plan plus its least floors, which
    # never cost more than the uniform floor.
    assert row["perseus_energy"] <= row["plan_floors_energy"] + 1e-6
    assert row["plan_floors_energy"] < row["uniform_energy"]
    assert row["plan"]["swing"] > 0.30 and row["solve_s"] > 0


def test_power_floor_gpu_check_smoke() -> None:
    res: dict[str, Any] = json.loads(run("power_floor_gpu.py", "--smoke"))
    assert res["floor_unavailable"] is None and res["held"] is True
    assert res["during"]["counter_w"] == pytest.approx(res["floor_w"], rel=0.05)
    assert res["before"]["counter_w"] == pytest.approx(80.0, rel=0.05)
    assert res["after"]["counter_w"] == pytest.approx(80.0, rel=0.05)


def test_power_floor_gpu_check_changes_nothing_without_apply() -> None:
    """The GPU check run on a lent or shared GPU reads only: no floor is set without --apply."""
    from benchmarks.power_floor_gpu import check
    from perseus_client import SimulatedGpu

    profile = {(0, "forward"): {1410: (0.02, 6.0)}}
    gpu = SimulatedGpu(profile, blocking_power=80.0, name="A100", max_power_limit_w=400.0)
    sets: list[float] = []
    gpu.set_power_floor = lambda watts: sets.append(watts) or True  # type: ignore[method-assign]
    res = check(gpu, 0.5, 0.05, apply=False)
    assert sets == [] and "held" not in res and res["applied"].startswith("no: read-only")
    assert res["max_power_limit_w"] == 400.0
    assert res["idle"]["counter_w"] == pytest.approx(80.0, rel=0.05)


@pytest.mark.slow
def test_oracle_timing_benchmark_smoke() -> None:
    """Another tenant's job and an unknown id: the same statuses in every case (not timings)."""
    rows: list[dict[str, Any]] = json.loads(run("oracle_timing.py", "--smoke", "--json"))
    assert len(rows) == 5
    for r in rows:
        assert r["status_foreign"] == r["status_unknown"] == [404], r
        assert r["requests_per_side"] == 20 and 0.0 <= r["mann_whitney_p"] <= 1.0
        assert r["median_us_foreign"] > 0 and r["median_us_unknown"] > 0


@pytest.mark.slow
def test_solve_load_smoke() -> None:
    """``benchmarks/solve_load.py --smoke``: idle and solving rows, every probe answered.

    Against this tree as its own baseline too (the ``--baseline`` path runs another tree's
    server from its sources).
    """
    rows = json.loads(run("solve_load.py", "--smoke", "--json", "--baseline", str(ROOT)))
    assert [(r["server"].split()[0], r["phase"]) for r in rows] == [
        ("this", "idle"), ("this", "solving"), ("baseline", "idle"), ("baseline", "solving"),
    ]  # fmt: skip
    for r in rows:
        assert r["failed"] == 0, r["server"]
        assert r["healthz"] and r["plan"], "a phase with no probes"
        assert min(r["healthz"] + r["plan"]) > 0
        solving = r["phase"] == "solving"
        assert (r["solve_wall"] is not None and r["solve_wall"] > 0) == solving
        assert (r["solve_cpu"] is not None and r["solve_cpu"] > 0) == solving


def test_store_versions_benchmark_smoke() -> None:
    from perseus_server.testing.postgres import postgres_binaries

    res: dict[str, Any] = json.loads(run("store_versions.py", "--smoke", "--json", timeout=900))
    kinds = ["sqlite"] + (["postgresql"] if postgres_binaries() is not None else [])
    for kind in kinds:
        ingest = res["measures"][f"{kind}_ingest_reports_per_s"]
        assert ingest["old"] > 0 and ingest["new"] > 0, ingest
        for measure in ("plan_query_ms", "deploy_ms", "open_ms"):
            m = res["measures"][f"{kind}_{measure}"]
            assert m["old"] > 0 and m["new"] > 0 and m["new_over_old"] > 0, (kind, measure, m)
