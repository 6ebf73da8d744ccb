"""The active/standby variants of the kit.

``deploy/kubernetes/ha/serve-ha.yaml`` (two replicas on an external PostgreSQL, the URL from a
Secret) and the systemd drop-in ``deploy/systemd/perseus-serve.service.d/postgres.conf``: their
``perseus serve`` command is accepted by the CLI, the drop-in passes ``systemd-analyze verify`` with
its unit, and what makes a standby work is there (ready only while leading, no liveness probe it
would fail, restarted after losing the lease).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_kit import DEPLOY, IMAGE, INSTALLED, _option, _unit, check_command

MANIFEST = DEPLOY / "kubernetes" / "ha" / "serve-ha.yaml"
DROP_IN = DEPLOY / "systemd" / "perseus-serve.service.d" / "postgres.conf"
URL = "postgresql://perseus@db.internal:5432/perseus"


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(MANIFEST.read_text())}


def test_the_ha_deployment_runs_two_servers_on_the_database_secret() -> None:
    objs = _objects()
    assert set(objs) == {
        ("Namespace", "perseus"),
        ("Deployment", "perseus-ha"),
        ("Service", "perseus-ha"),
    }
    dep, svc = objs[("Deployment", "perseus-ha")], objs[("Service", "perseus-ha")]
    spec = dep["spec"]
    assert spec["replicas"] == 2 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    volumes = {v["name"] for v in pod["volumes"]}
    for c in [*pod["initContainers"], *pod["containers"]]:
        assert c["image"] == IMAGE
        assert {m["name"] for m in c["volumeMounts"]} <= volumes, c["name"]
    (serve,) = pod["containers"]
    argv = serve["command"]
    assert _option(argv, "--db") == "$(PERSEUS_DB)"
    env = {e["name"]: e for e in serve["env"]}
    assert env["PERSEUS_DB"]["valueFrom"]["secretKeyRef"] == {"name": "perseus-db", "key": "url"}
    check_command([URL if a == "$(PERSEUS_DB)" else a for a in argv], "serve-ha.yaml")
    # Ready only while leading (a standby does not listen); no liveness probe to fail on it.
    assert serve["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert "livenessProbe" not in serve


def test_the_postgres_drop_in() -> None:
    u = _unit(DROP_IN)
    assert u["Service.ExecStart"][0] == ""  # clears the unit's ExecStart
    argv = shlex.split(u["Service.ExecStart"][1].replace("${PERSEUS_DB}", URL))
    assert argv[0] == INSTALLED
    check_command(["perseus", *argv[1:]], "postgres.conf")
    assert _option(argv, "--db") == URL
    assert u["Service.EnvironmentFile"] == ["/etc/perseus/db.env"]
    assert u["Service.Restart"] == ["always"]  # a deposed leader (exit 3) comes back as standby


def test_the_drop_in_passes_systemd_analyze_verify_with_its_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is absent (apt install systemd; scripts/setup does as root)")
    perseus = Path(sys.executable).with_name("perseus")
    if not perseus.exists():
        pytest.skip(f"no perseus console script beside {sys.executable} to point ExecStart at")
    unit = DEPLOY / "systemd" / "perseus-serve.service"
    (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED, str(perseus)))
    drop_ins = tmp_path / f"{unit.name}.d"
    drop_ins.mkdir()
    env = tmp_path / "db.env"
    env.write_text(f"PERSEUS_DB={URL}\n")
    (drop_ins / DROP_IN.name).write_text(
        DROP_IN.read_text()
        .replace(INSTALLED, str(perseus))
        .replace("/etc/perseus/db.env", str(env))
    )
    r = subprocess.run(
        [analyze, "verify", "--man=no", str(tmp_path / unit.name)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", (
        r.returncode,
        r.stdout,
        r.stderr,
    )
