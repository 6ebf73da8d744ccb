"""The shipped alert rules (``deploy/prometheus/alerts.yml``).

Prometheus accepts them, their unit tests (``alerts.test.yml``) pass under ``promtool test rules``
(Debian's ``prometheus``; skipped, saying so, only where ``promtool`` is absent: ``scripts/setup``
installs it), and every series a rule or its test uses is one that the server or gpud exports, so a
renamed metric fails here rather than silently never alerting (``tests/server/test_metrics_alerts.py``
checks the server's names and labels against a real server's ``/metrics``). Every rule has a unit
test in which it fires; every alert a tenant's jobs cause carries ``tenant`` there; no rule reads
the Perseus job from Prometheus's own ``job`` label; and the operations guide names exactly the
rules there are.
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
        "PerseusNoLeader",
        "PerseusInternalErrors",
        "PerseusStoreErrors",
        "PerseusRanksMissing",
        "PerseusSolvesFailing",
        "PerseusReplanStorm",
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
        if _series_in(expr) & PER_JOB:
            join = "on(perseus_job) group_left(name, tenant) perseus_job_info"
            assert join in expr, rule["alert"]


#: The server's per-job series (labelled ``perseus_job``), as the unit tests write them.
PER_JOB = {
    name
    for case in yaml.safe_load(TESTS.read_text())["tests"]
    for series in case["input_series"]
    if "perseus_job=" in series["series"]
    for name in _series_in(series["series"])
} - {"perseus_job_info"}


def _cases() -> dict[str, list[list[dict[str, object]]]]:
    """Per alert, the ``exp_alerts`` of each of its unit-test evaluations."""
    out: dict[str, list[list[dict[str, object]]]] = {}
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            out.setdefault(check["alertname"], []).append(check.get("exp_alerts") or [])
    return out


def test_every_rule_fires_in_a_unit_test_and_a_tenants_alert_names_the_tenant() -> None:
    cases = _cases()
    for rule in _rules():
        name, expr = str(rule["alert"]), str(rule["expr"])
        fired = [a for evaluation in cases.get(name, []) for a in evaluation]
        assert fired, f"{name}: no unit test in which it fires"
        tenants = bool(_series_in(expr) & PER_JOB) or "perseus_tenant_" in expr
        for alert in fired:
            labels = alert["exp_labels"]  # type: ignore[index]
            if tenants:
                assert labels.get("tenant"), (name, labels)  # type: ignore[union-attr]
    assert PER_JOB >= {"perseus_connected_ranks", "perseus_job_frontier_failed"}


def test_no_rule_reads_the_perseus_job_from_prometheus_job_label() -> None:
    """Prometheus's ``job`` is the scrape's: rules join and name jobs on ``perseus_job``."""
    for rule in _rules():
        text = str(rule["expr"]) + " ".join(str(v) for v in rule["annotations"].values())  # type: ignore[attr-defined]
        assert not re.search(r"on\s*\(\s*job\s*\)|\$labels\.job\b\s*\}\}/", text), rule["alert"]
    head = RULES.read_text().split("groups:")[0]
    assert "honor_labels: true" not in head


def test_the_operations_guide_names_the_rules_there_are() -> None:
    """Every alert the guide names is a shipped rule, and its table lists every rule."""
    guide = (ROOT / "docs" / "operations.md").read_text()
    classes = {  # the project's own names (PerseusClient...) are not alerts
        name
        for path in ROOT.glob("*/perseus*/**/*.py")
        for name in re.findall(r"^class (Perseus\w+)", path.read_text(), re.M)
    }
    named = set(re.findall(r"\b(Perseus[A-Z]\w+)\b", guide)) - classes
    rules = {str(r["alert"]) for r in _rules()}
    assert named <= rules, f"the guide names alerts that are not rules: {sorted(named - rules)}"
    table = set(re.findall(r"^\| `(Perseus\w+)` \|", guide, re.M))
    assert table == rules, (sorted(rules - table), sorted(table - rules))
