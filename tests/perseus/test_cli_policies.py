"""``perseus frontier`` selects a point by any plan policy of the registry.

Zeus's cost ``--eta`` among them; run as a real subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.profiles import Profile

PERSEUS = [sys.executable, "-m", "perseus"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PERSEUS, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory, slice_profile) -> Path:
    """The same small profile named after the A100 (a known GPU) and after nothing."""
    p: Profile = slice_profile([0, 1, 2, 3], {1410, 1305, 1200, 1095, 990, 855})
    d = tmp_path_factory.mktemp("cli")
    (d / "small_a100.csv").write_text(p.to_csv())
    (d / "small.csv").write_text(p.to_csv())
    return d


def frontier(profile: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run("frontier", str(profile), "--stages", "4", "--microbatches", "3",
               "--blocking-power", "83.64", *args, cwd=cwd)  # fmt: skip


def least_cost(points: list[dict[str, float]], eta: float, max_power: float) -> int:
    costs = [eta * p["energy"] + (1 - eta) * max_power * 4 * p["time"] for p in points]
    return costs.index(min(costs))


@pytest.mark.parametrize(
    ("name", "args", "max_power"),
    [("small_a100.csv", [], 400.0), ("small.csv", ["--max-power", "150"], 150.0)],
)
def test_eta_selects_the_least_cost_point(
    profiles: Path, tmp_path: Path, name: str, args: list[str], max_power: float
) -> None:
    out = frontier(profiles / name, "--eta", "0.8", *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    s = doc["selected"]
    assert s["eta"] == 0.8 and s["max_power"] == max_power
    assert s["point"] == least_cost(doc["points"], 0.8, max_power)
    assert (s["time"], s["energy"]) == (
        doc["points"][s["point"]]["time"],
        doc["points"][s["point"]]["energy"],
    )
    assert f"eta 0.8 (max power {max_power:g} W): point {s['point']}" in out.stderr


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("small.csv", ["--eta", "0.5"], "--max-power"),  # no known GPU, no --max-power
        ("small_a100.csv", ["--eta", "1.5"], "eta must be in [0, 1]"),
        ("small_a100.csv", ["--eta", "nan"], "eta must be a finite number"),
        ("small_a100.csv", ["--max-power", "300"], "max_power is an option of eta"),
    ],
)
def test_a_bad_policy_fails_before_the_solve_naming_it(
    profiles: Path, tmp_path: Path, name: str, args: list[str], message: str
) -> None:
    out = frontier(profiles / name, *args, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert message in out.stderr and "plans in" not in out.stderr


def test_two_policies_are_refused(profiles: Path, tmp_path: Path) -> None:
    out = frontier(profiles / "small.csv", "--eta", "0.5", "--deadline", "2", cwd=tmp_path)
    assert out.returncode == 2 and "not allowed with argument" in out.stderr
