"""The import layering: who may import whom.

- the core library (``perseus``, its CLI included) -> the shared vocabulary only: it imports
  none of the apps, not even lazily inside a function; the apps register their subcommands of
  ``perseus`` as entry points, which the CLI discovers;
- the shared vocabulary (``perseus_common``) -> nothing of ours, nothing heavy;
- the rank client (``perseus_client``) -> the shared vocabulary only, and none of the
  scheduler's dependencies (its framework integrations alone may import the frameworks);
  nothing of the node daemon;
- the node daemon (``perseus_gpud``) -> the client's GPU layer (``perseus_client.gpu``, its
  errors) and the shared vocabulary: one way only, the client never imports it;
- the server -> the core and the shared vocabulary, not the client or the demo;
- the demo -> anything (it is an application, using the server and the client as a user would).

Static checks read every module's imports with :mod:`ast` (module level and inside functions,
``importlib.import_module("...")`` too); one dynamic check imports the whole core in a fresh
interpreter and looks at ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "perseus"
COMMON = ROOT / "common" / "perseus_common"
CLIENT = ROOT / "client" / "perseus_client"
GPUD = ROOT / "gpud" / "perseus_gpud"
SERVER = ROOT / "server" / "perseus_server"
DEMO = ROOT / "demo" / "perseus_demo"

#: Our top-level packages.
OURS = frozenset(
    {
        "perseus",
        "perseus_common",
        "perseus_client",
        "perseus_gpud",
        "perseus_server",
        "perseus_demo",
    }
)
#: The applications built on the core.
APPS = frozenset({"perseus_server", "perseus_client", "perseus_gpud", "perseus_demo"})
#: What a training rank must never need: the scheduler's dependencies.
SCHEDULER_DEPENDENCIES = frozenset(
    {"numba", "scipy", "networkx", "fastapi", "uvicorn", "matplotlib", "starlette", "httpx"}
)
#: The training frameworks: only the client's integrations import them at module level.
FRAMEWORKS = frozenset({"torch", "deepspeed", "megatron"})


@dataclass(frozen=True)
class Import:
    """One import in a source file.

    The absolute module name, where, and whether it runs only when a function is called
    (``lazy``).
    """

    module: str
    path: Path
    line: int
    lazy: bool

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        where = "inside a function" if self.lazy else "at module level"
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.module} ({where})"


def _package_of(path: Path) -> str:
    """The dotted package a source file is in (for resolving relative imports)."""
    parts: list[str] = []
    d = path.parent
    while (d / "__init__.py").is_file():
        parts.insert(0, d.name)
        d = d.parent
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    """Every import in ``path``.

    ``import``, ``from ... import`` (relative ones resolved) and ``importlib.import_module`` /
    ``__import__`` of a string constant.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path)
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, path, node.lineno, lazy) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append(Import(module, path, node.lineno, lazy))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            args = node.args
            if (
                name in ("import_module", "__import__")
                and args
                and isinstance(args[0], ast.Constant)
                and isinstance(args[0].value, str)
            ):
                found.append(Import(args[0].value, path, node.lineno, lazy))
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def sources(root: Path) -> Iterator[Path]:
    """The package's Python files (generated gRPC stubs included)."""
    yield from sorted(root.rglob("*.py"))


def imports_in(root: Path) -> list[Import]:
    return [i for path in sources(root) for i in imports_of(path)]


# --- the scanner itself ----------------------------------------------------------------------


def test_the_scanner_sees_every_kind_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(
        "import os, perseus_server.cli\n"
        "from . import sibling\n"
        "from ..other import thing\n"
        "def f():\n"
        "    from perseus_demo import main\n"
        "    import importlib\n"
        "    return importlib.import_module('perseus_client'), __import__('scipy')\n"
        "class C:\n"
        "    def m(self):\n"
        "        import numba\n"
    )
    got = {(i.module, i.lazy) for i in imports_of(pkg / "mod.py")}
    assert got == {
        ("os", False), ("perseus_server.cli", False), ("pkg.sub", False), ("pkg.other", False),
        ("perseus_demo", True), ("importlib", True), ("perseus_client", True), ("scipy", True),
        ("numba", True),
    }  # fmt: skip


# --- the core --------------------------------------------------------------------------------


def test_importing_the_core_imports_none_of_the_apps() -> None:
    """Importing any core module in a fresh interpreter imports none of the apps.

    Import every core module (found with pkgutil, the CLI included; ``__main__`` runs the
    command) in a fresh interpreter, and build the command's parser as a core subcommand does:
    none of the apps ends up in ``sys.modules``.
    """
    probe = f"""
import importlib, json, pkgutil, sys
import perseus
skip = {{"perseus.__main__"}}
names = ["perseus"] + [
    m.name for m in pkgutil.walk_packages(perseus.__path__, "perseus.") if m.name not in skip
]
for name in names:
    importlib.import_module(name)
importlib.import_module("perseus.cli").build_parser(describe_apps=False)
apps = {sorted(APPS)!r}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in apps)
print(json.dumps({{"file": perseus.__file__, "names": names, "loaded": loaded}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert Path(doc["file"]).is_relative_to(CORE), doc["file"]  # this checkout's core
    modules = {n.removeprefix("perseus.") for n in doc["names"]}
    expected = {
        "profiles",
        "schedules",
        "dag",
        "problem",
        "frontier",
        "solver",
        "plot",
        "errors",
        "power",
    }
    assert expected <= modules, sorted(modules)
    assert "cli" in modules and not modules & {"__main__", "demo", "demo_rank"}
    assert doc["loaded"] == []


def test_the_core_imports_nothing_above_it() -> None:
    """Not the apps, not even lazily inside a function, not even from its CLI.

    Of ours, only itself and the shared vocabulary.
    """
    bad = [
        str(i)
        for i in imports_in(CORE)
        if i.top in OURS and i.top not in ("perseus", "perseus_common")
    ]
    assert bad == []
    # the scanner reads the CLI (the rule must not pass vacuously)
    assert any(i.module == "perseus.app_commands" for i in imports_of(CORE / "cli.py"))


def test_the_apps_register_their_subcommands_in_light_modules() -> None:
    """Each app's ``perseus`` subcommands, as ``pyproject.toml`` registers them.

    The installed metadata says the same (a stale install would hide a subcommand), each
    target is in its app, and importing every registration module loads none of the
    scheduler's dependencies, so ``perseus --help`` works on a plain install.
    """
    import tomllib
    from importlib.metadata import entry_points

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"]["perseus.commands"]
    installed = {e.name: e.value for e in entry_points(group="perseus.commands")}
    assert installed == declared, "reinstall the project (pip install -e .): its metadata is stale"
    modules = sorted({value.split(":")[0] for value in declared.values()})
    assert {m.split(".")[0] for m in modules} == APPS - {"perseus_client"}
    probe = f"""
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    heavy = SCHEDULER_DEPENDENCIES | FRAMEWORKS | {"numpy", "pydantic"}
    assert [m for m in json.loads(out.stdout) if m.split(".")[0] in heavy] == []


# --- the shared vocabulary and the client ----------------------------------------------------


def test_the_shared_vocabulary_imports_nothing_of_ours_and_nothing_heavy() -> None:
    """Pure Python plus the wire protocol's runtime (grpc, protobuf), so the client can use it."""
    allowed = set(sys.stdlib_module_names) | {"perseus_common", "grpc", "google"}
    assert [str(i) for i in imports_in(COMMON) if i.top not in allowed] == []


def test_the_client_imports_only_the_shared_vocabulary() -> None:
    """A training rank installs the light client.

    Nothing of the core, the server or the demo, none of the scheduler's dependencies, anywhere
    (lazily included).
    """
    forbidden = {"perseus", "perseus_server", "perseus_demo"} | SCHEDULER_DEPENDENCIES
    assert [str(i) for i in imports_in(CLIENT) if i.top in forbidden] == []


def test_the_client_imports_nothing_of_the_node_daemon() -> None:
    """The daemon uses the client's GPU layer, never the other way round.

    What both ends of the daemon's socket share (frames, socket location, messages) is in the
    shared vocabulary; the client's connection and errors are the client's.
    """
    assert [str(i) for i in imports_in(CLIENT) if i.top == "perseus_gpud"] == []


#: What of the rank client the node daemon may import: its GPU layer and its errors.
CLIENT_PARTS_FOR_THE_DAEMON = ("perseus_client.gpu", "perseus_client.errors")


def test_the_node_daemon_imports_only_the_clients_gpu_layer_and_the_shared_vocabulary() -> None:
    """``perseus_gpud``: no core, server, demo, scheduler dependency or framework, anywhere."""
    bad = []
    for i in imports_in(GPUD):
        if i.top in ("perseus_gpud", "perseus_common"):
            continue
        if i.top == "perseus_client":
            parts = i.module.split(".")
            if ".".join(parts[:2]) in CLIENT_PARTS_FOR_THE_DAEMON:
                continue
            bad.append(str(i))
        elif i.top in OURS or i.top in SCHEDULER_DEPENDENCIES or i.top in FRAMEWORKS:
            bad.append(str(i))
    assert bad == []
    # the scanner sees the daemon's real imports (the rule must not pass vacuously)
    seen = {i.module for i in imports_in(GPUD)}
    assert {"perseus_client.gpu.base", "perseus_common.gpud_wire"} <= seen, sorted(seen)


def test_only_the_clients_integrations_import_the_frameworks() -> None:
    """Outside ``integrations/``, the client uses torch only lazily, never DeepSpeed or Megatron.

    Lazily: CUDA events when torch is already there.
    """
    integrations = CLIENT / "integrations"
    bad = [
        str(i)
        for i in imports_in(CLIENT)
        if i.top in FRAMEWORKS
        and not i.path.is_relative_to(integrations)
        and (i.top != "torch" or not i.lazy)
    ]
    assert bad == []


# --- the apps --------------------------------------------------------------------------------


def test_the_server_imports_neither_the_client_nor_the_daemon_nor_the_demo() -> None:
    apps = ("perseus_client", "perseus_gpud", "perseus_demo")
    bad = [str(i) for i in imports_in(SERVER) if i.top in apps]
    assert bad == []


def test_the_demo_is_a_package_of_its_own() -> None:
    """The demo lives in ``demo/perseus_demo``, and the rank processes run its rank program.

    The core has no demo module.
    """
    import importlib.util

    from perseus_demo.orchestration import RANK_MODULE

    assert not (CORE / "demo.py").exists() and not (CORE / "demo_rank.py").exists()
    spec = importlib.util.find_spec(RANK_MODULE)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin) == DEMO / "rank.py"


# --- inside the server: its groups by role -------------------------------------------------

#: Each group of the server and the groups (or top-level modules) it may import; see
#: docs/architecture.md, "The server's tree". None imports ``testing``: the fault points are
#: production's seam (``runtime/faults.py``), whose hooks the tests install.
SERVER_GROUPS: dict[str, frozenset[str]] = {
    "domain": frozenset({"domain", "config"}),
    "config": frozenset({"config"}),
    "decisions": frozenset({"decisions", "domain", "config"}),
    "runtime": frozenset({"runtime", "domain", "config"}),
    "metric_series": frozenset({"metric_series"}),
    "metrics": frozenset({"metrics", "metric_series", "domain"}),
    "service": frozenset(
        {"service", "decisions", "runtime", "domain", "config", "metrics", "metric_series"}
    ),
    "models": frozenset({"models", "domain", "config"}),
    "rest": frozenset(
        {
            "rest",
            "models",
            "service",
            "decisions",
            "domain",
            "config",
            "metrics",
            "metric_series",
            "runtime",
        }
    ),
    "grpc": frozenset({"grpc", "service", "domain", "config", "runtime"}),
}


def _server_group(module: str) -> str:
    """``perseus_server.service.facade`` -> ``service``.

    ``perseus_server.testing.fault_hooks`` -> ``testing.fault_hooks``; a top-level module -> its name.
    """
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "testing" and len(parts) > 1:
        return "testing." + parts[1]
    return parts[0]


def test_the_server_groups_import_only_the_groups_below_them() -> None:
    bad = []
    for path in sources(SERVER):
        rel = path.relative_to(SERVER).with_suffix("")
        group = rel.parts[0] if len(rel.parts) > 1 else rel.name
        allowed = SERVER_GROUPS.get(group)
        if allowed is None:  # the package, its entry points and testing/: anything
            continue
        for i in imports_of(path):
            if i.top != "perseus_server" or i.module == "perseus_server":
                continue
            target = _server_group(i.module)
            if target not in allowed and not (target.startswith("testing.") and target in allowed):
                bad.append(f"{i} ({group} -> {target})")
    assert bad == []


def test_no_production_module_imports_the_test_fault_hooks() -> None:
    """Outside ``testing/``, nothing imports ``perseus_server.testing.fault_hooks``, lazily or not.

    (Nor ``from perseus_server.testing import ...``, which could name it.)
    """
    testing = SERVER / "testing"
    bad = [
        str(i)
        for path in sources(SERVER)
        if not path.is_relative_to(testing)
        for i in imports_of(path)
        if i.module in ("perseus_server.testing", "perseus_server.testing.fault_hooks")
    ]
    assert bad == []
    # the seam the fault points call is production's, and they call it
    users = {
        str(path.relative_to(SERVER))
        for path in sources(SERVER)
        for i in imports_of(path)
        if i.module == "perseus_server.runtime.faults"
    }
    assert {"service/solves.py", "runtime/solve_worker.py", "runtime/warmup.py"} <= users


def test_the_server_group_rules_cover_every_group() -> None:
    groups = {p.name for p in SERVER.iterdir() if (p / "__init__.py").is_file()}
    assert groups - {"testing", "ui"} <= set(SERVER_GROUPS), "a new group needs its import rule"
