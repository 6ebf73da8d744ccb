"""A module's tests are found by its name: the test tree mirrors the packages.

``tests/server/<group>/test_<module>[_<topic>].py`` tests ``server/perseus_server/<group>/
<module>.py`` (or the subpackage ``<module>/``); ``tests/benchmarks/test_<name>_smoke.py`` runs
``benchmarks/<name>.py --smoke``. A suite that crosses modules on purpose (every route fed
boundary values, a fuzzer over the whole schema) is listed below with why.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

#: Test folder -> the package folder it mirrors.
MIRRORS = {
    "tests/server": "server/perseus_server",
    "tests/benchmarks": "benchmarks",
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
}


def _modules(package: Path) -> set[str]:
    """The names a test file in ``package``'s mirror may start with: modules and subpackages."""
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
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
        "name each after the module it tests (tests/server/<group>/test_<module>[_<topic>].py, "
        f"tests/benchmarks/test_<benchmark>_smoke.py), or list it in CROSS_CUTTING: {stray}"
    )


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
    assert len(_test_files("tests/server")) > 80
