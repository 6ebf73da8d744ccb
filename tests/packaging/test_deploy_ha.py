"""The active/standby variants of the kit.

``deploy/kubernetes/ha/serve-ha.yaml`` (two replicas on an external PostgreSQL, the URL from a
Secret) and the systemd drop-in ``deploy/systemd/perseus-serve.service.d/postgres.conf``: their
``perseus serve`` command is accepted by the CLI, the drop-in passes ``systemd-analyze verify`` with
its unit, and what makes a standby work is there (ready only while leading, no liveness probe it
would fail, restarted after losing the lease).

The HA manifest has every piece of the single server's hardening: what that is is read from
``deploy/kubernetes/serve.yaml`` itself (its Namespace's labels, its NetworkPolicies, every field
of its pod and containers), so a piece added there and not here fails. What differs by design is
listed, each with its reason (:data:`BY_DESIGN`).
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
        ("NetworkPolicy", "perseus-ha"),
        ("Deployment", "perseus-ha"),
        ("Service", "perseus-ha"),
        ("Service", "perseus-ha-pods"),
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


SINGLE = DEPLOY / "kubernetes" / "serve.yaml"

#: What the HA server may lack or change of the single server's, and why (a field of a pod or a
#: container; ``--flag`` of the serve command; a mount path). Anything else must be there, equal.
BY_DESIGN = {
    "startupProbe": "a standby never turns ready: a startup probe would restart it",
    "livenessProbe": "as the startup probe; a deposed leader exits (status 3) instead",
    "readinessProbe": "compared apart: only its period differs (2 s: a failover is seen sooner)",
    "--db": "the store is the PostgreSQL URL from the Secret perseus-db, not a file",
    "/var/lib/perseus": "the store's volume: no file, so no PersistentVolumeClaim",
}


def _by_kind(path: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            out.setdefault(doc["kind"], []).append(doc)
    return out


def _flags(argv: list[str]) -> dict[str, str | None]:
    """``--flag`` -> its value (None for a flag followed by another flag or nothing)."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def _compare_container(one: dict[str, Any], ha: dict[str, Any], pod: tuple[Any, Any]) -> None:
    """``ha`` has every field of ``one``, equal, but for :data:`BY_DESIGN`'s."""
    name = one["name"]
    for key, value in one.items():
        if key in BY_DESIGN:
            continue
        if key == "command" and one["command"][:2] == ["perseus", "serve"]:
            flags = _flags(ha["command"])
            for flag, arg in _flags(value).items():
                assert flag in flags, f"{name}: the HA server has no {flag}"
                assert flag in BY_DESIGN or flags[flag] == arg, (name, flag, flags[flag], arg)
        elif key == "env":
            assert all(e in ha.get("env", []) for e in value), name
        elif key == "volumeMounts":
            vols = [{v["name"]: v for v in p["volumes"]} for p in pod]
            mounts = {m["mountPath"]: m for m in ha["volumeMounts"]}
            for m in value:
                if m["mountPath"] in BY_DESIGN:
                    continue
                assert m["mountPath"] in mounts, f"{name}: the HA server has no {m['mountPath']}"
                got = mounts[m["mountPath"]]
                assert got.get("readOnly") == m.get("readOnly"), (name, m)
                assert vols[1][got["name"]] | {"name": m["name"]} == vols[0][m["name"]], (name, m)
        else:
            assert ha.get(key) == value, f"{name}: {key} differs from serve.yaml's"
    if "readinessProbe" in one:
        assert ha["readinessProbe"]["httpGet"] == one["readinessProbe"]["httpGet"], name
    for probe in ("startupProbe", "livenessProbe"):
        assert probe not in ha, f"{name}: {BY_DESIGN[probe]}"


def test_the_ha_server_has_every_piece_of_the_single_servers_hardening() -> None:
    check_hardening(MANIFEST)


def check_hardening(manifest: Path) -> None:
    """``manifest`` has every piece of ``serve.yaml``'s hardening (see the module docstring)."""
    one, ha = _by_kind(SINGLE), _by_kind(manifest)
    # Every kind of object the single server has, but the store's volume claim.
    assert set(one) - {"PersistentVolumeClaim"} <= set(ha), set(one) - set(ha)
    # The namespace's labels (Pod Security "restricted"), all of them.
    (ns1,), (ns2,) = one["Namespace"], ha["Namespace"]
    assert ns1["metadata"]["labels"].items() <= ns2["metadata"].get("labels", {}).items()
    (dep1,), (dep2,) = one["Deployment"], ha["Deployment"]
    assert dep2["spec"]["strategy"] == dep1["spec"]["strategy"]
    pods = dep1["spec"]["template"]["spec"], dep2["spec"]["template"]["spec"]
    ha_labels = dep2["spec"]["template"]["metadata"]["labels"]
    # The same NetworkPolicies, selecting the HA pods.
    for policy in one["NetworkPolicy"]:
        spec = {k: v for k, v in policy["spec"].items() if k != "podSelector"}
        twins = [
            p
            for p in ha["NetworkPolicy"]
            if {k: v for k, v in p["spec"].items() if k != "podSelector"} == spec
            and p["metadata"]["namespace"] == policy["metadata"]["namespace"]
        ]
        assert twins, f"no NetworkPolicy like serve.yaml's {policy['metadata']['name']}"
        assert twins[0]["spec"]["podSelector"]["matchLabels"].items() <= ha_labels.items()
    # Every field of the pod (its security context, no service-account token...), equal.
    for key, value in pods[0].items():
        if key not in ("containers", "initContainers", "volumes"):
            assert pods[1].get(key) == value, f"the HA pod's {key} differs from serve.yaml's"
    for group in ("initContainers", "containers"):
        theirs = {c["name"]: c for c in pods[1].get(group, [])}
        for c in pods[0].get(group, []):
            assert c["name"] in theirs, (group, c["name"])
            _compare_container(c, theirs[c["name"]], pods)
    # The Services answer on the same ports, over TLS (the serve command's flags above).
    ports = {yaml.safe_dump(p) for p in one["Service"][0]["spec"]["ports"]}
    for svc in ha["Service"]:
        assert {yaml.safe_dump(p) for p in svc["spec"]["ports"]} == ports, svc["metadata"]["name"]
        assert svc["spec"]["selector"].items() <= ha_labels.items()


def test_the_hardening_comparison_catches_a_piece_left_out(tmp_path: Path) -> None:
    """The comparison above can fail: each piece dropped from the HA manifest is caught."""
    text = MANIFEST.read_text()
    cuts = {
        "TLS": ("            - --tls-cert\n            - /etc/perseus/tls/tls.crt\n", ""),
        "Pod Security": ("    pod-security.kubernetes.io/enforce: restricted\n", ""),
        "no service-account token": ("      automountServiceAccountToken: false\n", ""),
        "read-only root": ("readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"),
        "the tenants' access": ("              - {key: perseus.io/tenant, operator: Exists}", "              - {key: perseus.io/tenants, operator: Exists}"),
        "HTTPS probe": ("{path: /healthz, port: http, scheme: HTTPS}", "{path: /healthz, port: http}"),
    }  # fmt: skip
    for what, (old, new) in cuts.items():
        assert old in text, what
        cut = tmp_path / "serve-ha.yaml"
        cut.write_text(text.replace(old, new, 1))
        with pytest.raises(AssertionError):
            check_hardening(cut)
        print(f"caught: {what}")
