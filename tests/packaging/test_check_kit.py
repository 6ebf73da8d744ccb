"""``scripts/check_kit``: the deployment kit's validators, as ``.ci/run``'s ``kit`` stage runs them.

It validates every manifest under ``deploy/kubernetes/`` with ``kubernetes-validate --strict`` (for
Kubernetes 1.30 and the newest it knows) and the alert rules with ``promtool check rules`` and
``promtool test rules``; it passes on the shipped kit and fails on a manifest with an unknown
field, on rules Prometheus refuses, and on a rule its unit test does not expect. Skipped, saying
so, only where ``promtool`` is absent (``scripts/setup`` installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_kit"


def _check(deploy: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/setup adds it)")
    args = [str(SCRIPT)] if deploy is None else [str(SCRIPT), str(deploy)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_ci_runs_the_kits_validators_as_a_stage_of_its_own() -> None:
    stages = re.findall(r"^stage (\w+) (.+)$", (ROOT / ".ci" / "run").read_text(), re.M)
    names = [name for name, _ in stages]
    assert ("kit", "scripts/check_kit") in stages
    assert names.index("kit") < names.index("tests")  # a broken kit fails before the long part


def test_the_shipped_kit_passes_every_validator() -> None:
    r = _check()
    assert r.returncode == 0, r.stdout + r.stderr
    manifests = len(list((ROOT / "deploy" / "kubernetes").rglob("*.yaml")))
    assert f"-k 1.30.0: {manifests} manifests" in r.stdout
    assert re.search(rf"-k 1\.\d+\.\d+: {manifests} manifests", r.stdout.split("1.30.0")[1])
    assert "SUCCESS: " in r.stdout and "Unit Testing:  alerts.test.yml\n  SUCCESS" in r.stdout


@pytest.mark.parametrize(
    ("path", "old", "new", "said"),
    [
        (
            "kubernetes/ha/serve-ha.yaml",
            "readOnlyRootFilesystem: true",
            "readOnlyRootFilesysten: true",
            "'readOnlyRootFilesysten' was unexpected",
        ),
        ("prometheus/alerts.yml", "expr: perseus_tenant_power", "expr: perseus_tenant_power(", ""),
        ("prometheus/alerts.yml", "for: 5m", "for: 50m", "alertname: PerseusSlowLink"),
    ],
    ids=["unknown field", "bad PromQL", "unit test not met"],
)
def test_a_broken_kit_fails(tmp_path: Path, path: str, old: str, new: str, said: str) -> None:
    deploy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", deploy)
    text = (deploy / path).read_text()
    assert old in text
    (deploy / path).write_text(text.replace(old, new, 1))
    r = _check(deploy)
    assert r.returncode != 0, r.stdout
    assert said in r.stdout + r.stderr
