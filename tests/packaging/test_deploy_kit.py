"""The deployment kit in ``deploy/``: each piece checked against the project as it is.

- The systemd units pass ``systemd-analyze verify`` (Debian's systemd; skips naming it when
  absent) with their ``ExecStart`` pointed at this install's ``perseus``, and carry the
  hardening and restart policy the operations guide promises.
- The Kubernetes manifests parse (PyYAML); every volume mount names a volume, the Service,
  the PVC and the Secret copy fit the Deployment, and the trainer snippet reaches the Service
  and gpud's socket through the same host directory the DaemonSet serves it in.
- Every ``perseus`` command the units and manifests run is accepted by the project's CLI (its
  arguments followed by ``--help``: argparse checks every value it reads up to there) and every
  flag they pass appears in that subcommand's ``--help``.
- The Dockerfile copies paths that exist, installs an extra the project has, warms a module that
  exists and starts the project's console script. Nothing is built or pulled.
"""

from __future__ import annotations

import grp
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
#: Where the units expect the install (a virtualenv, see the Dockerfile and the guide).
INSTALLED = "/opt/perseus/bin/perseus"
IMAGE = "perseus:0.1.0"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The project's ``perseus`` command (this tree's code: ``PYTHONPATH`` is inherited)."""
    return subprocess.run(
        [sys.executable, "-m", "perseus", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PERSEUS_WARM_KERNELS": "0"},
    )


@cache
def _help(sub: str) -> str:
    r = _cli(sub, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


def check_command(argv: list[str], where: str) -> None:
    """``argv`` (``perseus <sub> ...``) is accepted and every flag it passes is documented."""
    assert Path(argv[0]).name == "perseus", f"{where}: {argv}"
    sub, args = argv[1], argv[2:]
    assert sub in ("serve", "gpud"), f"{where}: runs perseus {sub}"
    r = _cli(sub, *args, "--help")
    assert r.returncode == 0, f"{where}: perseus {shlex.join(argv[1:])} --help: {r.stderr}"
    flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    assert flags, where
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", _help(sub)), (
            f"{where}: perseus {sub} has no {flag}"
        )


def _option(argv: list[str], flag: str) -> str:
    assert flag in argv, (flag, argv)
    return argv[argv.index(flag) + 1]


# --- systemd --------------------------------------------------------------------------------


def _unit(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> values (continuation lines joined, comments dropped)."""
    out: dict[str, list[str]] = {}
    section = ""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def test_units_are_there() -> None:
    assert {u.name for u in UNITS} == {"perseus-serve.service", "perseus-gpud.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_passes_systemd_analyze_verify(unit: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is absent (apt install systemd; scripts/setup does as root)")
    perseus = Path(sys.executable).with_name("perseus")
    if not perseus.exists():
        pytest.skip(f"no perseus console script beside {sys.executable} to point ExecStart at")
    text = unit.read_text()
    assert INSTALLED in text
    copy = tmp_path / unit.name
    copy.write_text(text.replace(INSTALLED, str(perseus)))
    r = subprocess.run(
        [analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=120
    )
    # verify exits 0 on an unknown key or a bad value, only saying so: both must be empty
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", (
        r.returncode,
        r.stdout,
        r.stderr,
    )


def test_serve_unit() -> None:
    u = _unit(DEPLOY / "systemd" / "perseus-serve.service")
    argv = shlex.split(u["Service.ExecStart"][0])
    assert argv[0] == INSTALLED
    # %d: the credentials directory; the token is a credential only the service reads
    assert _option(argv, "--token-file") == "%d/token"
    assert u["Service.LoadCredential"] == ["token:/etc/perseus/token"]
    check_command([*argv[:2], *(a.replace("%d", "/run/credentials/x") for a in argv[2:])], "serve unit")  # fmt: skip
    assert u["Service.DynamicUser"] == ["yes"]
    state = u["Service.StateDirectory"][0]
    assert _option(argv, "--db").startswith(f"/var/lib/{state}/")
    assert u["Service.Environment"] == ["XDG_CACHE_HOME=/var/cache/" + u["Service.CacheDirectory"][0]]  # fmt: skip
    assert u["Service.Restart"] == ["on-failure"] and u["Service.KillSignal"] == ["SIGTERM"]
    assert int(u["Service.LimitNOFILE"][0]) >= 65536
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert u[f"Service.{key}"] == ["yes"], key
    assert u["Service.ProtectSystem"] == ["strict"] and u["Service.CapabilityBoundingSet"] == [""]
    assert "MemoryDenyWriteExecute" not in "".join(u)  # numba's kernels need W+X memory


def test_gpud_unit() -> None:
    u = _unit(DEPLOY / "systemd" / "perseus-gpud.service")
    argv = shlex.split(u["Service.ExecStart"][0])
    assert argv[0] == INSTALLED
    # the unit names the host's group `perseus` (the guide has it created); the CLI resolves
    # group names, so check the command with a group this machine has
    assert _option(argv, "--group") == _option(argv, "--allow-gid") == "perseus"
    here = grp.getgrgid(os.getgid()).gr_name
    check_command([here if a == "perseus" and i > 1 else a for i, a in enumerate(argv)], "gpud unit")  # fmt: skip
    socket = Path(_option(argv, "--socket"))
    assert socket.parent == Path("/run") / u["Service.RuntimeDirectory"][0]
    assert u["Service.RuntimeDirectoryPreserve"] == ["yes"]  # trainers' view survives a restart
    assert u["Service.Restart"] == ["always"] and int(u["Service.LimitNOFILE"][0]) >= 65536
    assert "DynamicUser" not in "".join(u)  # root: NVML's clock calls
    assert "CAP_SYS_ADMIN" in u["Service.CapabilityBoundingSet"][0].split()
    assert u["Service.ProtectSystem"] == ["strict"] and u["Service.NoNewPrivileges"] == ["yes"]
    assert "PrivateDevices" not in "".join(u)  # it needs /dev/nvidia*


# --- Kubernetes -----------------------------------------------------------------------------


@cache
def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, over every manifest."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict) and {"apiVersion", "kind", "metadata"} <= doc.keys(), path
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, key
            out[key] = doc
    return out


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]
    return spec if obj["kind"] == "Pod" else spec["template"]["spec"]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _mount(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume of ``container``'s mount that holds ``path`` (the longest matching mount)."""
    hits = [m for m in container["volumeMounts"] if Path(path).is_relative_to(m["mountPath"])]
    assert hits, (container["name"], path)
    m = max(hits, key=lambda m: len(m["mountPath"]))
    return {**_volume(pod, m["name"]), "mount": m}


def _volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    vols = {v["name"]: v for v in pod["volumes"]}
    assert name in vols, name
    return vols[name]


def test_manifests_parse_and_every_mount_names_a_volume() -> None:
    objs = _objects()
    kinds = {k for k, _ in objs}
    assert {"Namespace", "PersistentVolumeClaim", "Deployment", "Service", "DaemonSet", "Pod"} <= kinds  # fmt: skip
    perseus_commands = 0
    for (kind, name), obj in objs.items():
        if kind not in ("Deployment", "DaemonSet", "Pod"):
            continue
        pod = _pod(obj)
        if kind != "Pod":
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        for c in _containers(pod):
            for m in c.get("volumeMounts", []):
                _volume(pod, m["name"])
            if c["command"][0] == "perseus":
                assert c["image"] == IMAGE, (name, c["name"])
                check_command(c["command"], f"{kind} {name} container {c['name']}")
                perseus_commands += 1
    assert perseus_commands == 2  # serve and gpud


def test_serve_deployment_service_pvc_and_token() -> None:
    objs = _objects()
    dep, svc = objs[("Deployment", "perseus")], objs[("Service", "perseus")]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod = _pod(dep)
    serve = next(c for c in pod["containers"] if c["name"] == "serve")
    argv = serve["command"]
    assert argv[:2] == ["perseus", "serve"]
    # the store on the PVC defined alongside
    db = _mount(pod, serve, _option(argv, "--db"))
    assert ("PersistentVolumeClaim", db["persistentVolumeClaim"]["claimName"]) in objs
    # the token: the Secret's file copied by the init container into a private file the
    # server reads (it refuses a file other users can read)
    token = _option(argv, "--token-file")
    assert _mount(pod, serve, token).get("emptyDir") is not None
    (init,) = pod["initContainers"]
    copy = shlex.split(init["command"][-1])
    assert copy[:3] == ["install", "-m", "0600"] and copy[-1] == token
    assert _mount(pod, init, copy[-1])["name"] == _mount(pod, serve, token)["name"]
    assert _mount(pod, init, copy[-2])["secret"]["secretName"] == "perseus-token"
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the Service reaches the container's ports, which are the ones serve listens on
    ports = {p["name"]: p["containerPort"] for p in serve["ports"]}
    assert ports == {
        "http": int(_option(argv, "--http-port")),
        "grpc": int(_option(argv, "--grpc-port")),
    }
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == set(ports)
    assert serve["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert _option(argv, "--host") == "0.0.0.0"  # reached from other pods, with the token


def test_gpud_daemonset_mounts_what_it_needs() -> None:
    ds = _objects()[("DaemonSet", "perseus-gpud")]
    pod = _pod(ds)
    (gpud,) = pod["containers"]
    argv = gpud["command"]
    assert argv[:2] == ["perseus", "gpud"]
    assert pod["hostPID"] is True and gpud["securityContext"]["privileged"] is False
    socket = _option(argv, "--socket")
    sock_dir = _mount(pod, gpud, socket)
    assert sock_dir["hostPath"]["path"] == str(Path(socket).parent)
    kubelet = _mount(pod, gpud, _option(argv, "--kubelet-socket"))
    assert kubelet["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert kubelet["mount"]["readOnly"] is True
    logs = _mount(pod, gpud, _option(argv, "--pod-logs-dir") + "/x")
    assert logs["hostPath"]["path"] == "/var/log/pods" and logs["mount"]["readOnly"] is True
    # its state and metrics in host directories of their own, not next to the socket
    for flag in ("--state", "--metrics-textfile"):
        path = _option(argv, flag)
        assert not Path(path).is_relative_to(Path(socket).parent), flag
        assert _mount(pod, gpud, path)["hostPath"]["path"] == str(Path(path).parent), flag
    # only the NVIDIA device nodes, from the NVIDIA runtime: no /dev from the host
    assert all(v.get("hostPath", {}).get("path") != "/dev" for v in pod["volumes"])
    env = {e["name"]: e["value"] for e in gpud["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and pod["runtimeClassName"] == "nvidia"


def test_trainer_reaches_the_server_and_gpuds_socket() -> None:
    objs = _objects()
    trainer = next(o for (k, _), o in objs.items() if k == "Pod")
    pod = _pod(trainer)
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    svc = objs[("Service", "perseus")]
    grpc_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    want = f"grpcs://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{grpc_port}"
    assert env["PERSEUS_SERVER"]["value"] == want
    assert "secretKeyRef" in env["PERSEUS_TOKEN"]["valueFrom"]  # a credential, not a literal
    assert "PERSEUS_JOB" in env
    gpud_argv = _pod(objs[("DaemonSet", "perseus-gpud")])["containers"][0]["command"]
    socket = env["PERSEUS_GPUD_SOCKET"]["value"]
    assert socket == _option(gpud_argv, "--socket")
    gpud_dir = _mount(_pod(objs[("DaemonSet", "perseus-gpud")]), {"name": "gpud", "volumeMounts": _pod(objs[("DaemonSet", "perseus-gpud")])["containers"][0]["volumeMounts"]}, socket)  # fmt: skip
    here = _mount(pod, c, socket)
    assert here["hostPath"]["path"] == gpud_dir["hostPath"]["path"]
    assert here["mount"]["readOnly"] is True
    groups = pod["securityContext"]["supplementalGroups"]
    assert int(_option(gpud_argv, "--group")) in groups
    assert int(_option(gpud_argv, "--allow-gid")) in groups
    assert pod["securityContext"]["runAsNonRoot"] is True


# --- Dockerfile -----------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_installs_this_repository() -> None:
    steps = _dockerfile()
    ops = [op for op, _ in steps]
    known = {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "ENTRYPOINT", "CMD", "ARG", "LABEL"}
    assert ops[0] == "FROM" and set(ops) <= known, ops
    copied = set()
    for op, rest in steps:
        if op == "COPY":
            *sources, _dest = rest.split()
            for s in sources:
                assert (ROOT / s).exists(), f"COPY {s}: no such path in the repository"
                copied.add(s)
    copied.discard("deploy/requirements.lock")  # checked in test_deploy_review.py
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # every package root the build looks in, and what the build reads, is copied
    where = project["tool"]["setuptools"]["packages"]["find"]["where"]
    packages = {p for w in where for p in ([w] if w != "." else ["perseus"])}
    assert packages | {"pyproject.toml", "README.md", "profiles"} <= copied, copied
    run = " ".join(rest for op, rest in steps if op == "RUN")
    extras = re.findall(r"pip install --no-deps '\.\[([\w,]+)\]'", run)
    assert extras and set(extras[0].split(",")) <= project["project"]["optional-dependencies"].keys()  # fmt: skip
    for module in re.findall(r"python -m ([\w.]+)", run):
        if module != "venv":
            assert find_spec(module) is not None, module
    entry = next(rest for op, rest in steps if op == "ENTRYPOINT")
    assert yaml.safe_load(entry) == ["perseus"] and "perseus" in project["project"]["scripts"]
    # the manifests run the image this file builds, under the name its header gives
    assert f"-t {IMAGE} ." in (DEPLOY / "Dockerfile").read_text()
