"""The Kubernetes kit against a security review (issue #31, item 5), offline.

What is checked:

- every manifest validates against the Kubernetes API's schemas (``kubernetes-validate``, which
  ships them: no cluster, no network), strictly (an unknown field fails), for the oldest
  Kubernetes the kit supports (1.30: ValidatingAdmissionPolicy) and the newest it knows;
- trainer pods mount gpud's socket directory read-only and nothing else of gpud's;
- the gpud DaemonSet has the systemd unit's capabilities, not ``privileged``, a node-critical
  priority, probes, no service-account token, a read-only root;
- serve has TLS from a Secret, a NetworkPolicy (gRPC from training namespaces, REST from the
  platform's), probes over HTTPS, resources, non-root, a read-only root;
- each namespace's Pod Security level is the one ``docs/operations.md`` gives;
- the admission policy of the training namespaces admits the shipped trainer pod and refuses
  each thing ``baseline`` would (its CEL evaluated by ``cel-python``);
- the image installs its dependencies from a lock with a sha256 per wheel.

What a cluster would add (admission actually run, the API server's typed CEL compilation, the
NVIDIA runtime injecting device nodes) is not tested here.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_deploy_kit import DEPLOY, ROOT, _containers, _objects, _option, _pod, _unit, check_command

kubernetes_validate = pytest.importorskip("kubernetes_validate")

MANIFESTS = sorted((DEPLOY / "kubernetes").rglob("*.yaml"))  # variants in subdirectories too
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_matches_the_kubernetes_schemas(path: Path, version: str) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs
    for doc in docs:
        if doc is not None:  # an empty document (a trailing ---)
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_catches_a_wrong_field() -> None:
    """The validation above can fail: a misspelt field and a wrong type are refused."""
    ds = _objects()[("DaemonSet", "perseus-gpud")]
    bad = yaml.safe_load(yaml.safe_dump(ds))
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)
    bad = yaml.safe_load(yaml.safe_dump(ds))
    bad["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def _gpud() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = _pod(_objects()[("DaemonSet", "perseus-gpud")])
    (container,) = pod["containers"]
    return pod, container


def _host_paths(pod: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}


def test_trainer_pods_mount_the_socket_read_only_and_nothing_else_of_gpuds() -> None:
    trainer = next(o for (k, _), o in _objects().items() if k == "Pod")
    pod = _pod(trainer)
    _, gpud = _gpud()
    socket_dir = str(Path(_option(gpud["command"], "--socket")).parent)
    assert set(_host_paths(pod).values()) == {socket_dir}
    for c in _containers(pod):
        for m in c.get("volumeMounts", []):
            if m["name"] in _host_paths(pod):
                assert m.get("readOnly") is True, (c["name"], m)
    # what gpud writes besides the socket lies outside that directory
    for flag in ("--state", "--metrics-textfile"):
        assert not Path(_option(gpud["command"], flag)).is_relative_to(socket_dir), flag
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PERSEUS_TENANT"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["PERSEUS_TLS_CA"]["value"].startswith("/etc/perseus-ca/")


def test_gpud_has_the_units_capabilities_and_is_not_privileged() -> None:
    pod, gpud = _gpud()
    sc = gpud["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    unit = _unit(DEPLOY / "systemd" / "perseus-gpud.service")
    bounding = {c.removeprefix("CAP_") for c in unit["Service.CapabilityBoundingSet"][0].split()}
    assert set(sc["capabilities"]["add"]) == bounding
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["automountServiceAccountToken"] is False
    socket = _option(gpud["command"], "--socket")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        argv = gpud[probe]["exec"]["command"]
        assert argv[:3] == ["perseus", "gpud", "status"] and _option(argv, "--socket") == socket
        check_command(argv, f"gpud {probe}")
    # nothing of the host but its socket, state and metrics directories and the kubelet's
    assert set(_host_paths(pod).values()) == {
        str(Path(socket).parent),
        str(Path(_option(gpud["command"], "--state")).parent),
        str(Path(_option(gpud["command"], "--metrics-textfile")).parent),
        "/var/lib/kubelet/pod-resources",
        "/var/log/pods",
    }
    policy = _objects()[("NetworkPolicy", "perseus-gpud-none")]
    assert (
        policy["metadata"]["namespace"]
        == _objects()[("DaemonSet", "perseus-gpud")]["metadata"]["namespace"]
    )
    assert (
        policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy["spec"]
    )


def test_serve_has_tls_a_network_policy_probes_and_no_root() -> None:
    objs = _objects()
    dep = objs[("Deployment", "perseus")]
    pod = _pod(dep)
    serve = next(c for c in pod["containers"] if c["name"] == "serve")
    argv = serve["command"]
    mounts = {m["mountPath"]: m for m in serve["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
        path = Path(_option(argv, flag))
        assert path.name == key
        volume = volumes[mounts[str(path.parent)]["name"]]
        assert volume["secret"]["secretName"] == "perseus-tls", flag
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert serve[probe]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTPS"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for c in _containers(pod):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= serve["resources"]["requests"].keys()
    assert "memory" in serve["resources"]["limits"]
    # gRPC from training namespaces, REST from the platform's, both from the tenants' own,
    # nothing else
    policy = objs[("NetworkPolicy", "perseus")]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        dep["spec"]["template"]["metadata"]["labels"].items()
    )
    assert admitted(policy) == {
        ("grpc", "perseus.io/trainers=true"),
        ("http", "perseus.io/platform=true"),
        ("http", "perseus.io/tenant"),
        ("grpc", "perseus.io/tenant"),
    }
    assert {p["name"] for p in serve["ports"]} == {port for port, _ in admitted(policy)}


def admitted(policy: dict[str, Any]) -> set[tuple[str, str]]:
    """(port, namespaces) pairs a NetworkPolicy admits: ``key=value`` labels, a bare key (Exists).

    Only namespace selectors are expected (no pod or IP blocks: anything else fails here).
    """
    out = set()
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            assert peer.keys() == {"namespaceSelector"}, peer
            sel = peer["namespaceSelector"]
            terms = [f"{k}={v}" for k, v in sel.get("matchLabels", {}).items()]
            for e in sel.get("matchExpressions", []):
                assert e["operator"] == "Exists", e
                terms.append(e["key"])
            for port in rule["ports"]:
                assert port["protocol"] == "TCP"
                out.add((port["port"], ",".join(sorted(terms))))
    return out


def test_the_guide_documents_every_namespace_label_the_network_policies_select() -> None:
    """A label the NetworkPolicies select on is one the guide tells the operator to set."""
    guide = (ROOT / "docs" / "operations.md").read_text()
    policies = [o for (kind, _), o in _objects().items() if kind == "NetworkPolicy"]
    labels = {term.split("=")[0] for p in policies if "ingress" in p["spec"] for _, t in admitted(p) for term in t.split(",")}  # fmt: skip
    assert labels == {"perseus.io/trainers", "perseus.io/platform", "perseus.io/tenant"}
    for label in labels:
        assert re.search(rf"kubectl label ns [\w-]+ [^`]*{re.escape(label)}=", guide), label


def test_trainer_policy_binds_to_the_training_namespaces() -> None:
    objs = _objects()
    policy = objs[("ValidatingAdmissionPolicy", "perseus-trainer-pods")]
    binding = objs[("ValidatingAdmissionPolicyBinding", "perseus-trainer-pods")]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "perseus.io/trainers": "true"
    }
    _, gpud = _gpud()
    socket_dir = str(Path(_option(gpud["command"], "--socket")).parent)
    text = yaml.safe_dump(policy["spec"]["validations"])
    assert f"'{socket_dir}'" in text and "readOnly" in text


def test_each_namespace_has_the_pod_security_level_the_guide_gives() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    table = dict(
        re.findall(r"^\| `([\w-]+)` \| `(privileged|baseline|restricted)` \|", guide, re.M)
    )
    objs = _objects()
    namespaces = {name: o for (kind, name), o in objs.items() if kind == "Namespace"}
    assert namespaces.keys() == {"perseus", "perseus-node"}
    for name, ns in namespaces.items():
        level = ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        assert table.get(name) == level, (name, level)
    assert table.get("training") == "privileged"  # the trainers' own, with trainer-policy.yaml
    for (kind, _), o in objs.items():
        if kind in ("Deployment", "DaemonSet"):
            assert o["metadata"]["namespace"] in namespaces


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_images_dependencies_are_pinned_with_hashes() -> None:
    lock = DEPLOY / "requirements.lock"
    text = re.sub(r"\\\n\s*", " ", lock.read_text())
    pinned = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            m = re.fullmatch(
                r"([A-Za-z0-9_.-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})", line.strip()
            )
            assert m, f"not pinned with a hash: {line}"
            pinned[m.group(1).lower().replace("_", "-")] = m.group(2)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        _name(r) for r in project["dependencies"] + project["optional-dependencies"]["server"]
    }
    assert wanted <= pinned.keys(), f"not in the lock: {sorted(wanted - pinned.keys())}"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    runs = [shlex.split(r) for r in re.findall(r"pip install ([^\\\n&]+)", dockerfile)]
    assert ["--require-hashes", "--only-binary=:all:", "-r", "requirements.lock"] in runs
    assert ["--no-deps", ".[server]"] in runs
    # the lock is installed before the sources are copied: nothing else resolves
    assert dockerfile.index("--require-hashes") < dockerfile.index("COPY server server")


def _admits(pod: dict[str, Any]) -> list[str]:
    """The messages of the trainer policy's validations that ``pod`` fails (empty: admitted).

    Its CEL is evaluated by ``cel-python`` as the API server would, ``variables`` included.
    """
    celpy = pytest.importorskip("celpy")
    spec = _objects()[("ValidatingAdmissionPolicy", "perseus-trainer-pods")]["spec"]
    env = celpy.Environment()
    activation: dict[str, Any] = {"object": celpy.json_to_cel(pod)}
    variables: dict[str, Any] = {}
    for var in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        variables[var["name"]] = env.program(env.compile(var["expression"])).evaluate(activation)
    activation["variables"] = celpy.celtypes.MapType(variables)
    return [
        rule["message"]
        for rule in spec["validations"]
        if not env.program(env.compile(rule["expression"])).evaluate(activation)
    ]


def test_trainer_policy_admits_the_trainer_and_refuses_what_baseline_would() -> None:
    trainer = next(o for (k, _), o in _objects().items() if k == "Pod")
    assert _admits(trainer) == []

    def variant(change: Any) -> list[str]:
        pod = yaml.safe_load(yaml.safe_dump(trainer))
        change(pod["spec"])
        return _admits(pod)

    def state_dir(spec: dict[str, Any]) -> None:
        spec["volumes"].append({"name": "state", "hostPath": {"path": "/var/lib/perseus-gpud"}})

    def writable(spec: dict[str, Any]) -> None:
        spec["containers"][0]["volumeMounts"][0]["readOnly"] = False

    def init_writes(spec: dict[str, Any]) -> None:
        mount = {"name": "perseus-gpud", "mountPath": "/run/perseus"}
        spec["initContainers"] = [{"name": "i", "image": "x", "volumeMounts": [mount]}]

    def host_pid(spec: dict[str, Any]) -> None:
        spec["hostPID"] = True

    def privileged(spec: dict[str, Any]) -> None:
        spec["containers"][0]["securityContext"]["privileged"] = True

    def cap_add(spec: dict[str, Any]) -> None:
        spec["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]

    def ephemeral(spec: dict[str, Any]) -> None:
        debug = {"name": "d", "image": "x", "securityContext": {"privileged": True}}
        spec["ephemeralContainers"] = [debug]

    def host_port(spec: dict[str, Any]) -> None:
        spec["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 80}]

    assert variant(state_dir) == [
        "the only hostPath a training pod may mount is gpud's socket directory, /run/perseus"
    ]
    for change in (writable, init_writes):
        assert variant(change) == ["gpud's socket directory must be mounted readOnly: true"]
    assert variant(host_pid) == ["training pods may not share the host's pid, ipc or network namespace"]  # fmt: skip
    for change in (privileged, cap_add, ephemeral):
        assert variant(change) == ["training containers may not be privileged or add capabilities"]
    assert variant(host_port) == ["training containers may not use host ports"]
