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
    "tests/server/service/test_units.py": "the service's small pure parts, a few tests each",
    "tests/client/integrations/test_stdout_clean.py": "every integration's exported orders",
    "tests/client/integrations/test_zeus_e2e.py": "Zeus's own optimizer, ranks and server",
    "tests/gpud/test_gpud_torch_e2e.py": "training ranks, the server and the daemon together",
    "tests/gpud/test_gpud_verification.py": "a throttled daemon seen in the server's status",
    "tests/common/test_vocabulary.py": "the shared vocabulary, as every package uses it",
    "tests/perseus/test_public_api.py": "the core's public names (perseus/__init__.py)",
    "tests/perseus/test_lp_reference.py": "the solver tests' LP oracle, a helper beside it",
    "tests/demo/test_demo.py": "the demo, end to end",
    "tests/demo/test_demo_swing.py": "the demo's swing run, end to end",
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
