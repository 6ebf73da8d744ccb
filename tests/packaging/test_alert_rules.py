"""The shipped alert rules (``deploy/prometheus/alerts.yml``).

Prometheus accepts them, their unit tests (``alerts.test.yml``) pass under ``promtool test rules``
(Debian's ``prometheus``; skipped, saying so, only where ``promtool`` is absent: ``scripts/setup``
installs it), and every series a rule or its test uses is one that the server or gpud exports, so a
renamed metric fails here rather than silently never alerting.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
TESTS = RULES.with_name("alerts.test.yml")
#: Series from elsewhere: Prometheus's own, node-exporter's textfile collector.
EXTERNAL = {"up", "node_textfile_mtime_seconds"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/setup adds it)")
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent
    )


def test_promtool_accepts_the_rules() -> None:
    r = _promtool("check", "rules", RULES.name)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_pass() -> None:
    r = _promtool("test", "rules", TESTS.name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _series_in(text: str) -> set[str]:
    """Metric names in a PromQL expression or a series selector (ours, and the external ones)."""
    names = set(re.findall(r"\b(perseus_[a-z_]+)\b(?![\\.])", text))  # not a file name
    return names | {n for n in EXTERNAL if re.search(rf"\b{n}\b", text)}


def _exported() -> set[str]:
    """Every metric name the server and gpud export (from their code)."""
    from perseus_gpud import metrics as gpud_metrics

    names = set(gpud_metrics._HELP)
    for path in (ROOT / "server" / "perseus_server").rglob("*.py"):
        names |= set(re.findall(r'"(perseus_[a-z_]+)"', path.read_text()))
    return names


def test_every_rule_routes_and_every_series_it_uses_is_exported() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} >= {
        "PerseusGpuLockedWithoutHolder",
        "PerseusRankWithoutClockControl",
        "PerseusPowerBudgetInfeasible",
        "PerseusTenantBelowGuaranteedShare",
        "PerseusServerDown",
        "PerseusGpudDown",
        "PerseusProfileMismatch",
        "PerseusSlowLink",
    }
    used: set[str] = set()
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]  # type: ignore[index]
        assert rule["annotations"]["summary"], rule["alert"]  # type: ignore[index]
        used |= _series_in(str(rule["expr"]))
        for text in rule["annotations"].values():  # type: ignore[attr-defined]
            used |= _series_in(" ".join(re.findall(r'query "([^"]*)"', str(text))))
    tests = yaml.safe_load(TESTS.read_text())
    tested = {
        name
        for case in tests["tests"]
        for series in case["input_series"]
        for name in _series_in(series["series"])
    }
    assert used <= tested, f"rules whose series no unit test feeds: {sorted(used - tested)}"
    missing = sorted((used | tested) - _exported() - EXTERNAL)
    assert not missing, f"series neither the server nor gpud exports: {missing}"
    # A job's alerts name it and its tenant: every rule on a per-job series joins the info.
    for rule in rules:
        expr = str(rule["expr"])
        if re.search(r"perseus_(ranks_without|profile_mismatch|slow_link)", expr):
            assert "group_left(name, tenant) perseus_job_info" in expr, rule["alert"]
