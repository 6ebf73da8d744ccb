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
}


#: Modules with no test file named after them, each with where its tests are and why. A module
#: whose tests live elsewhere gets its own ``test_<module>.py``; only a module with nothing of its
#: own to test (an entry point, a registration line) stays here.
NOT_BY_NAME = {
    # server
    "server/perseus_server/__main__.py": "not yet split out (issue 42)",
    "server/perseus_server/cli.py": "not yet split out (issue 42)",
    "server/perseus_server/commands.py": "not yet split out (issue 42)",
    "server/perseus_server/decisions/planner.py": "not yet split out (issue 42)",
    "server/perseus_server/domain/errors.py": "not yet split out (issue 42)",
    "server/perseus_server/domain/instruction_columns.py": "not yet split out (issue 42)",
    "server/perseus_server/domain/jobs.py": "not yet split out (issue 42)",
    "server/perseus_server/domain/rows.py": "not yet split out (issue 42)",
    "server/perseus_server/domain/states.py": "not yet split out (issue 42)",
    "server/perseus_server/domain/store.py": "not yet split out (issue 42)",
    "server/perseus_server/grpc/plan_encoder.py": "not yet split out (issue 42)",
    "server/perseus_server/grpc/received.py": "not yet split out (issue 42)",
    "server/perseus_server/metric_series.py": "not yet split out (issue 42)",
    "server/perseus_server/models/requests.py": "not yet split out (issue 42)",
    "server/perseus_server/models/responses.py": "not yet split out (issue 42)",
    "server/perseus_server/models/status.py": "not yet split out (issue 42)",
    "server/perseus_server/rest/monitoring.py": "not yet split out (issue 42)",
    "server/perseus_server/rest/plan_fast_path.py": "not yet split out (issue 42)",
    "server/perseus_server/rest/power_budget.py": "not yet split out (issue 42)",
    "server/perseus_server/rest/problems.py": "not yet split out (issue 42)",
    "server/perseus_server/rest/profiles.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/byte_bounded_cache.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/db_copy.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/fair_slots.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/logs.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/parse_pool.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/schema/env.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/schema/fresh.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/schema/legacy_postgres.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/schema/legacy_sqlite.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/schema/versions/r0001_baseline.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/sql_store.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/store_rows.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/warmup.py": "not yet split out (issue 42)",
    "server/perseus_server/runtime/write_limits.py": "not yet split out (issue 42)",
    "server/perseus_server/service/budget_draw.py": "not yet split out (issue 42)",
    "server/perseus_server/service/budget_pacing.py": "not yet split out (issue 42)",
    "server/perseus_server/service/budget_terms.py": "not yet split out (issue 42)",
    "server/perseus_server/service/context.py": "not yet split out (issue 42)",
    "server/perseus_server/service/credentials.py": "not yet split out (issue 42)",
    "server/perseus_server/service/deployment.py": "not yet split out (issue 42)",
    "server/perseus_server/service/facade.py": "not yet split out (issue 42)",
    "server/perseus_server/service/facade_admin.py": "not yet split out (issue 42)",
    "server/perseus_server/service/ingest.py": "not yet split out (issue 42)",
    "server/perseus_server/service/job_gauges.py": "not yet split out (issue 42)",
    "server/perseus_server/service/job_profiles.py": "not yet split out (issue 42)",
    "server/perseus_server/service/persistence.py": "not yet split out (issue 42)",
    "server/perseus_server/service/plan_powers.py": "not yet split out (issue 42)",
    "server/perseus_server/service/registration.py": "not yet split out (issue 42)",
    "server/perseus_server/service/state.py": "not yet split out (issue 42)",
    "server/perseus_server/service/views.py": "not yet split out (issue 42)",
    "server/perseus_server/service/zeus.py": "not yet split out (issue 42)",
    "server/perseus_server/testing/fault_hooks.py": "not yet split out (issue 42)",
    "server/perseus_server/testing/postgres.py": "not yet split out (issue 42)",
    "server/perseus_server/testing/process.py": "not yet split out (issue 42)",
    # client
    "client/perseus_client/defaults.py": "not yet split out (issue 42)",
    "client/perseus_client/errors.py": "not yet split out (issue 42)",
    "client/perseus_client/gpu/curves.py": "not yet split out (issue 42)",
    "client/perseus_client/gpu/recording.py": "not yet split out (issue 42)",
    "client/perseus_client/gpu/simulated_floor.py": "not yet split out (issue 42)",
    "client/perseus_client/gpu/simulated_injection.py": "not yet split out (issue 42)",
    "client/perseus_client/gpu/vendors.py": "not yet split out (issue 42)",
    "client/perseus_client/integrations/_torch_p2p.py": "not yet split out (issue 42)",
    "client/perseus_client/measurements.py": "not yet split out (issue 42)",
    "client/perseus_client/plan_choice.py": "not yet split out (issue 42)",
    "client/perseus_client/scopes.py": "not yet split out (issue 42)",
    # gpud
    "gpud/perseus_gpud/__main__.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/access.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/cli.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/commands.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/devices.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/files.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/lockrecord.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/peers.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/procfs.py": "not yet split out (issue 42)",
    "gpud/perseus_gpud/replies.py": "not yet split out (issue 42)",
    # common
    "common/perseus_common/clocks.py": "not yet split out (issue 42)",
    "common/perseus_common/commands.py": "not yet split out (issue 42)",
    "common/perseus_common/gpus.py": "not yet split out (issue 42)",
    "common/perseus_common/kinds.py": "not yet split out (issue 42)",
    "common/perseus_common/located_error.py": "not yet split out (issue 42)",
    "common/perseus_common/orders.py": "not yet split out (issue 42)",
    "common/perseus_common/profile_csv.py": "not yet split out (issue 42)",
    "common/perseus_common/wire/codec.py": "not yet split out (issue 42)",
    "common/perseus_common/wire/values.py": "not yet split out (issue 42)",
    # perseus
    "perseus/__main__.py": "not yet split out (issue 42)",
    "perseus/app_commands.py": "not yet split out (issue 42)",
    "perseus/errors.py": "not yet split out (issue 42)",
    "perseus/kernels/cache.py": "not yet split out (issue 42)",
    "perseus/kernels/exchange.py": "not yet split out (issue 42)",
    "perseus/kernels/longest_paths.py": "not yet split out (issue 42)",
    "perseus/kernels/network_simplex.py": "not yet split out (issue 42)",
    "perseus/kernels/relaxed.py": "not yet split out (issue 42)",
    "perseus/kernels/rounding.py": "not yet split out (issue 42)",
    "perseus/kernels/search.py": "not yet split out (issue 42)",
    "perseus/kernels/warm.py": "not yet split out (issue 42)",
    "perseus/plot.py": "not yet split out (issue 42)",
    "perseus/power/cluster.py": "not yet split out (issue 42)",
    "perseus/power/floors.py": "not yet split out (issue 42)",
    "perseus/power/plan_power.py": "not yet split out (issue 42)",
    "perseus/power/timeline_plot.py": "not yet split out (issue 42)",
    "perseus/power/uniform.py": "not yet split out (issue 42)",
    "perseus/solver/breakpoints.py": "not yet split out (issue 42)",
    "perseus/solver/candidates.py": "not yet split out (issue 42)",
    "perseus/solver/options.py": "not yet split out (issue 42)",
    "perseus/solver/rounder.py": "not yet split out (issue 42)",
    "perseus/solver/solve.py": "not yet split out (issue 42)",
    "perseus/solver/stages.py": "not yet split out (issue 42)",
    # demo
    "demo/perseus_demo/__main__.py": "the python -m entry; run by tests/demo/test_demo.py's fixture",
    "demo/perseus_demo/commands.py": "registers `perseus demo`; run by tests/perseus/test_cli_subcommands.py",
    "demo/perseus_demo/errors.py": "one exception class; raised in tests/demo/test_options.py, test_profile.py",
    # benchmarks
    "benchmarks/failover_load.py": "not yet split out (issue 42)",
    "benchmarks/gpud_kubelet.py": "not yet split out (issue 42)",
    "benchmarks/milp_check.py": "not yet split out (issue 42)",
    "benchmarks/per_clock.py": "not yet split out (issue 42)",
    "benchmarks/profiling_transfers.py": "not yet split out (issue 42)",
    "benchmarks/status_load.py": "not yet split out (issue 42)",
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
