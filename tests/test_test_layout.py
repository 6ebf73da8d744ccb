"""A module's tests are found by its name: the test tree mirrors the packages.

``tests/<app>/<group>/test_<module>[_<topic>].py`` tests ``<package>/<group>/<module>.py`` (or
the subpackage ``<module>/``), where ``MIRRORS`` names each app's package: for example
``tests/server/rest/test_plans_answers.py`` tests ``server/perseus_server/rest/plans.py`` and
``tests/client/gpu/test_nvml.py`` tests ``client/perseus_client/gpu/nvml.py``;
``tests/benchmarks/test_<name>_smoke.py`` runs ``benchmarks/<name>.py --smoke``. A suite that
crosses modules on purpose (every route fed boundary values, a fuzzer over the whole schema, a
training run end to end) is listed below with why, and so is a folder that checks files, not
modules. Every folder of ``tests/`` is one or the other.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

#: Test folder -> the package folder it mirrors.
MIRRORS = {
    "tests/server": "server/perseus_server",
    "tests/client": "client/perseus_client",
    "tests/gpud": "gpud/perseus_gpud",
    "tests/common": "common/perseus_common",
    "tests/perseus": "perseus",
    "tests/demo": "demo/perseus_demo",
    "tests/benchmarks": "benchmarks",
}

#: Test folders that mirror no package, each with why.
UNMIRRORED = {
    "tests": "its own files only: checks over the whole tree (layering, names, docs, this layout)",
    "tests/packaging": "the wheel and the deployment kit in deploy/: files, not modules",
}

#: Suites that cross modules on purpose, each with why.
CROSS_CUTTING = {
    "tests/server/test_boundary_values.py": "every REST route and gRPC method, boundary values",
    "tests/server/test_cost_bounds.py": "every list, cache, queue and solve bounded",
    "tests/server/test_existence_oracle.py": "every route: another tenant's id as an unknown one",
    "tests/server/test_fuzz.py": "schemathesis over the whole OpenAPI schema",
    "tests/server/test_hostile_input.py": "malformed input on every path of a real server",
    "tests/server/test_profile_parsers_fuzz.py": "every profile parser an upload may reach",
    "tests/server/test_vocabulary_tables.py": "each open vocabulary against its one table",
    "tests/client/integrations/test_stdout_clean.py": "every integration's exported orders",
    "tests/client/integrations/test_zeus_e2e.py": "Zeus's own optimizer, ranks and server",
    "tests/gpud/test_gpud_torch_e2e.py": "training ranks, the server and the daemon together",
    "tests/gpud/test_gpud_verification.py": "a throttled daemon seen in the server's status",
    "tests/common/test_vocabulary.py": "the one profile reader, as the core and the client read it",
    "tests/perseus/test_public_api.py": "the core's public names (perseus/__init__.py)",
    "tests/perseus/test_lp_reference.py": "the solver tests' LP oracle, a helper beside it",
    "tests/demo/test_demo.py": "the demo, end to end",
}


#: Modules with no test file named after them, each with where its tests are and why. A module
#: whose tests live elsewhere gets its own ``test_<module>.py``; only a module with nothing of its
#: own to test (an entry point, a registration line) stays here.
NOT_BY_NAME = {
    # server
    "server/perseus_server/__main__.py": "the python -m entry; run by tests/server/test_cli.py",
    "server/perseus_server/commands.py": "two registration lines; run by tests/perseus/test_cli_subcommands.py",
    # gpud
    "gpud/perseus_gpud/__main__.py": "the python -m entry; run by tests/gpud/test_cli_daemon.py",
    "gpud/perseus_gpud/commands.py": "registers `perseus gpud`; tests/perseus/test_cli_subcommands.py",
    # common
    "common/perseus_common/commands.py": "a dataclass and a name; tests/perseus/test_cli_subcommands.py",
    # perseus
    "perseus/__main__.py": "the python -m entry; run by tests/perseus/test_cli.py",
    # demo
    "demo/perseus_demo/__main__.py": "the python -m entry; run by tests/demo/test_demo.py's fixture",
    "demo/perseus_demo/commands.py": "registers `perseus demo`; run by tests/perseus/test_cli_subcommands.py",
    "demo/perseus_demo/errors.py": "one exception class; raised in tests/demo/test_options.py, test_profile.py",
    # benchmarks
    "benchmarks/failover_load.py": "failover.py's load (imported); run by tests/benchmarks/test_failover_smoke.py",
    "benchmarks/profiling_transfers.py": "profiling.py's transfers (imported); run by test_profiling_smoke.py",
    "benchmarks/status_load.py": "server.py --status-load's part; run by tests/server/rest/test_job_status_pages.py",
}


def _modules(package: Path) -> set[str]:
    """The names a test file in ``package``'s mirror may start with: modules and subpackages.

    A private module's leading underscore is dropped (``_base.py`` is tested by ``test_base.py``).
    """
    names = {p.stem.lstrip("_") for p in package.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return names


def _subject(test: Path) -> str:
    """``test_<subject>.py`` -> ``<subject>`` (a benchmark's ``_smoke`` suffix dropped)."""
    stem = test.stem.removeprefix("test_")
    return stem.removesuffix("_smoke")


def _maps(test: Path, mirror: Path) -> bool:
    """Whether ``test`` is named after a module (or subpackage) of its folder's package."""
    package = mirror / test.parent.relative_to(TESTS / test.parent.relative_to(TESTS).parts[0])
    if not package.is_dir():
        return False
    subject = _subject(test)
    return any(subject == m or subject.startswith(m + "_") for m in _modules(package))


def _test_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("test_*.py"))


def test_every_test_file_is_named_after_a_module() -> None:
    stray = [
        str(t.relative_to(ROOT))
        for folder, package in MIRRORS.items()
        for t in _test_files(folder)
        if not _maps(t, ROOT / package) and str(t.relative_to(ROOT)) not in CROSS_CUTTING
    ]
    assert not stray, (
        "name each after the module it tests (tests/<app>/<group>/test_<module>[_<topic>].py, "
        f"tests/benchmarks/test_<benchmark>_smoke.py), or list it in CROSS_CUTTING: {stray}"
    )


def test_every_test_folder_mirrors_a_package_or_says_why_not() -> None:
    folders = {str(t.parent.relative_to(ROOT)) for t in TESTS.rglob("test_*.py")}
    loose = [
        f
        for f in sorted(folders)
        if f not in UNMIRRORED and not any(f == m or f.startswith(m + "/") for m in MIRRORS)
    ]
    assert not loose, f"mirror a package in MIRRORS, or say why not in UNMIRRORED: {loose}"


def test_test_modules_outside_packages_have_distinct_names() -> None:
    # Outside tests/server (a package) pytest imports a test file by its bare name: two files of
    # one name in different folders stop collection. Name each after its module and topic.
    bare = [t for t in TESTS.rglob("test_*.py") if not (t.parent / "__init__.py").exists()]
    names = sorted(t.name for t in bare)
    assert sorted(set(names)) == names, sorted({n for n in names if names.count(n) > 1})


def test_the_cross_cutting_list_names_files_that_exist_and_cross() -> None:
    for path in CROSS_CUTTING:
        assert (ROOT / path).is_file(), f"{path} is gone: drop it from CROSS_CUTTING"
        folder = next(f for f in MIRRORS if path.startswith(f + "/"))
        assert not _maps(ROOT / path, ROOT / MIRRORS[folder]), f"{path} maps: unlist it"


def test_the_mapping_reads_real_names() -> None:
    # Not vacuous: the tree has mirrored files, and a misnamed one would be caught.
    server = ROOT / MIRRORS["tests/server"]
    assert _maps(TESTS / "server" / "rest" / "test_plans_answers.py", server)
    assert _maps(TESTS / "server" / "runtime" / "test_leadership.py", server)
    assert not _maps(TESTS / "server" / "rest" / "test_leadership.py", server)
    assert not _maps(TESTS / "server" / "nowhere" / "test_plans.py", server)
    assert _maps(TESTS / "benchmarks" / "test_scaling_smoke.py", ROOT / "benchmarks")
    client = ROOT / MIRRORS["tests/client"]
    assert _maps(TESTS / "client" / "gpu" / "test_nvml.py", client)
    assert _maps(TESTS / "client" / "integrations" / "test_base.py", client)  # _base.py
    assert not _maps(TESTS / "client" / "test_nvml.py", client)
    assert _maps(TESTS / "perseus" / "solver" / "test_sandwich.py", ROOT / "perseus")
    assert not _maps(TESTS / "perseus" / "test_sandwich.py", ROOT / "perseus")
    assert len(_test_files("tests/server")) > 80
    assert len(_test_files("tests/client")) > 30


def _package_modules() -> list[tuple[Path, Path]]:
    """Every hand-written module of the mirrored packages, with its test folder."""
    found = []
    for folder, package in MIRRORS.items():
        for module in sorted((ROOT / package).rglob("*.py")):
            rel = module.relative_to(ROOT / package)
            if module.stem == "__init__" or module.stem.endswith(("_pb2", "_pb2_grpc")):
                continue
            found.append((module, ROOT / folder / rel.parent))
    return found


def _has_own_tests(module: Path, folder: Path) -> bool:
    name = module.stem.lstrip("_")
    if folder.parts[-1] == "benchmarks" and folder.parent == TESTS:
        return (folder / f"test_{name}_smoke.py").is_file()
    return (folder / f"test_{name}.py").is_file() or any(folder.glob(f"test_{name}_*.py"))


def test_every_module_has_a_test_file_named_after_it() -> None:
    missing = [
        str(module.relative_to(ROOT))
        for module, folder in _package_modules()
        if not _has_own_tests(module, folder) and str(module.relative_to(ROOT)) not in NOT_BY_NAME
    ]
    assert not missing, f"give each its tests/<app>/<group>/test_<module>.py: {missing}"


def test_the_not_by_name_list_is_current() -> None:
    modules = {str(m.relative_to(ROOT)): _has_own_tests(m, f) for m, f in _package_modules()}
    gone = [path for path in NOT_BY_NAME if path not in modules]
    assert not gone, f"these modules are gone: drop them from NOT_BY_NAME: {gone}"
    named = [path for path in NOT_BY_NAME if modules[path]]
    assert not named, f"these now have their own test file: drop them from NOT_BY_NAME: {named}"


def test_each_listed_module_names_a_test_that_exists() -> None:
    # A newcomer who does not find a module's file by name is sent to the test that runs it.
    names = {t.name for t in TESTS.rglob("test_*.py")}
    for path, why in NOT_BY_NAME.items():
        cited = re.findall(r"test_\w+\.py", why)
        assert cited, f"{path}: name the test that runs it"
        missing = [c for c in cited if c not in names]
        assert not missing, f"{path}: {missing} do not exist"
