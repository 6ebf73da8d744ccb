"""The ``perseus`` command line, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.plan_codec import decode_rank_plans
from perseus.profiles import Profile

PERSEUS = [sys.executable, "-m", "perseus"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PERSEUS, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def profile_csv(tmp_path_factory: pytest.TempPathFactory, slice_profile) -> Path:
    p: Profile = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855})
    path = tmp_path_factory.mktemp("cli") / "small.csv"
    path.write_text(p.to_csv())
    return path


def test_frontier_writes_json_with_plans_and_a_png(profile_csv: Path, tmp_path: Path) -> None:
    out = run(
        "frontier", str(profile_csv), "--stages", "4", "--microbatches", "3",
        "--blocking-power", "83.64", "--plans", "--output", "f.json", "--plot", "f.png",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["schedule"] == "1f1b" and doc["stages"] == 4 and doc["microbatches"] == 3
    assert doc["blocking_power"] == 83.64
    pts = doc["points"]
    times = [p["time"] for p in pts]
    assert times == sorted(times) and times[0] <= doc["max_frequency_time"]
    plans = list(decode_rank_plans(doc))  # the compact per-rank form
    assert len(plans) == len(pts)
    for p, plan in zip(pts, plans, strict=True):
        assert p["lower_bound"] <= p["energy"] * (1 + 1e-12)
        assert len(plan) == 4  # one list per rank, in that rank's execution order
        for r, rank_plan in enumerate(plan):
            assert len(rank_plan) == 2 * 3
            assert {s["instruction"] for s in rank_plan} == {"forward", "backward"}
            assert {s["stage"] for s in rank_plan} == {r}
            assert all(s["frequency"] in {1410, 1305, 1200, 1095, 990, 855} for s in rank_plan)
    # 1F1B on the last stage alternates forward and backward from the start
    assert [s["instruction"] for s in plans[0][3][:2]] == ["forward", "backward"]
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plans in" in out.stderr  # the summary line


def test_resolution_thins_but_keeps_both_ends(profile_csv: Path, tmp_path: Path) -> None:
    base = [
        "frontier",
        str(profile_csv),
        "--stages",
        "4",
        "--microbatches",
        "3",
        "--blocking-power",
        "80",
    ]
    full = json.loads(run(*base, cwd=tmp_path).stdout)["points"]
    span = full[-1]["time"] - full[0]["time"]
    thin = json.loads(run(*base, "--resolution", str(span / 5), cwd=tmp_path).stdout)["points"]
    assert 2 <= len(thin) < len(full)
    assert thin[0] == full[0] and thin[-1] == full[-1]
    gaps = [b["time"] - a["time"] for a, b in zip(thin, thin[1:], strict=False)]
    assert min(gaps) >= span / 5 * (1 - 1e-9)


def test_plot_redraws_a_saved_frontier(profile_csv: Path, tmp_path: Path) -> None:
    run("frontier", str(profile_csv), "--stages", "4", "--microbatches", "2", "--blocking-power", "80",
        "-o", "f.json", cwd=tmp_path)  # fmt: skip
    out = run("plot", "f.json", "--output", "again.png", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("body", "args", "needle"),
    [
        ("stage,instruction,frequency,time,energy\n0,forward,1410,0.05,20\n0,backward,1410,nan,40\n",
         ["--stages", "1", "--microbatches", "2"], "row 3, field 'time'"),
        ("stage,instruction,frequency,time,energy\n0,forward,1410,0.05,20\n0,backward,1410,0.1,40\n",
         ["--stages", "2", "--microbatches", "2"], "field 'stages'"),
        ("stage,instruction,frequency,time,energy\n0,forward,1410,0.05,20\n0,backward,1410,0.1,40\n",
         ["--stages", "1", "--microbatches", "0"], "microbatches"),
        ("stage,instruction,frequency,time,energy\n0,forward,1410,0.05,20\n0,backward,1410,0.1,40\n",
         ["--stages", "1", "--microbatches", "2", "--effort", "-1"], "effort: must be"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, body: str, args: list[str], needle: str
) -> None:
    (tmp_path / "p.csv").write_text(body)
    out = run("frontier", "p.csv", *args, "--blocking-power", "80", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert out.stdout == ""


def test_blocking_power_is_required_for_unknown_gpus(tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_text(
        "stage,instruction,frequency,time,energy\n0,forward,1,1,1\n0,backward,1,1,1\n"
    )
    out = run("frontier", "p.csv", "--stages", "1", "--microbatches", "1", cwd=tmp_path)
    assert out.returncode != 0 and "--blocking-power is required" in out.stderr


def test_version_names_the_installed_distribution(tmp_path: Path) -> None:
    from importlib.metadata import version

    out = run("--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"perseus {version('perseus')}"


def test_version_without_an_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from perseus import cli

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert cli.version() == "0+unknown"


def test_power_budget_picks_the_fastest_plan_within_it(profile_csv: Path, tmp_path: Path) -> None:
    base = ["frontier", str(profile_csv), "--stages", "4", "--microbatches", "3",
            "--blocking-power", "83.64"]  # fmt: skip
    doc = json.loads(run(*base, cwd=tmp_path).stdout)
    powers = [p["energy"] / p["time"] for p in doc["points"]]
    watts = 0.5 * (powers[0] + powers[-1])
    out = run(*base, "--power-budget", str(watts), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["points"] == doc["points"]
    b = got["power_budget"]
    best = min(i for i, p in enumerate(powers) if p <= watts)
    assert b["point"] == best and b["watts"] == watts
    assert b["time"] == doc["points"][best]["time"] and b["energy"] == doc["points"][best]["energy"]
    assert b["average_power"] == pytest.approx(powers[best]) and b["average_power"] <= watts
    assert b["peak_power"] >= b["average_power"] / 4  # per GPU, the hottest instruction
    assert f"within {watts:g} W: point {best}, T = {b['time']:.4f} s" in out.stderr
    assert f"average power {b['average_power']:.1f} W" in out.stderr


@pytest.mark.parametrize("watts", ["10", "-5", "nan"])
def test_an_unmet_power_budget_exits_2_naming_the_lowest_power(
    profile_csv: Path, tmp_path: Path, watts: str
) -> None:
    out = run("frontier", str(profile_csv), "--stages", "4", "--microbatches", "3",
              "--blocking-power", "83.64", "--power-budget", watts, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2
    assert out.stdout == ""
    if watts == "10":
        assert "no plan draws at most 10 W on average; the lowest achievable is" in out.stderr
    else:
        assert "power budget must be a finite number of watts > 0" in out.stderr


def test_a_profile_with_more_stages_than_the_job_needs_profile_stages(
    profile_csv: Path, tmp_path: Path
) -> None:
    def frontier(*extra: str) -> subprocess.CompletedProcess[str]:
        job = ("--stages", "2", "--microbatches", "2", "--blocking-power", "83.64")
        return run("frontier", str(profile_csv), *job, *extra, cwd=tmp_path)

    refused = frontier()
    assert refused.returncode == 2
    assert "--profile-stages 0-1" in refused.stderr and "4 stages" in refused.stderr
    chosen = frontier("--profile-stages", "2-3", "--output", "f.json")
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads((tmp_path / "f.json").read_text())["points"]
    bad = frontier("--profile-stages", "3-9")
    assert bad.returncode == 2 and "stage 4 is not in the profile" in bad.stderr


def test_frontier_power_timeline_and_swing_bounds(profile_csv: Path, tmp_path: Path) -> None:
    out = run(
        "frontier", str(profile_csv), "--stages", "4", "--microbatches", "6",
        "--blocking-power", "83.64", "--slowdown", "0", "--max-swing", "0.3",
        "--max-ramp", "0.12", "--power-timeline", "t.png", "--output", "f.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "f.json").read_text())
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before, swing = doc["power_timeline"], doc["swing"]
    assert before["swing"] > 0.3 and before["peak_w"] > before["trough_w"] > 0
    after = swing["power_timeline"]
    assert after["swing"] <= 0.3 + 1e-6
    assert after["max_change_w"]["0.1"] <= 0.12 * after["peak_w"] * (1 + 1e-6)
    assert swing["energy"] == pytest.approx(swing["plan_energy"] + swing["floor_energy"])
    assert len(swing["power_floors"]) == 4
    assert swing["time"] <= doc["max_frequency_time"] * (1 + 1e-12)
    assert "floors" in out.stderr and "swing 0.300" in out.stderr
    bad = run(
        "frontier", str(profile_csv), "--stages", "4", "--microbatches", "6",
        "--blocking-power", "83.64", "--max-swing", "1.5", cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2 and "max_swing" in bad.stderr
