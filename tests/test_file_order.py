"""The suite runs its longest files first, each file's tests together and in their own order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from file_order import file_of, file_weights, heavy_files_first, measured_seconds

TESTS = Path(__file__).resolve().parent

COLLECTED = [
    "tests/a/test_quick.py::test_one",
    "tests/a/test_quick.py::test_two",
    "tests/b/test_e2e.py::test_trains[2-stage]",
    "tests/b/test_e2e.py::test_trains[4-stage]",
    "tests/b/test_e2e.py::test_reports",
    "tests/c/test_unmeasured.py::test_new",
    "tests/d/test_bench.py::Bench::test_smoke",
    "tests/e/test_also_quick.py::test_one",
]
SECONDS = {"test_one": 1.0, "test_two": 1.0, "test_trains": 50.0, "test_smoke": 80.0}


def _files(order: list[int]) -> list[str]:
    files: list[str] = []
    for position in order:
        file = file_of(COLLECTED[position])
        if not files or files[-1] != file:
            files.append(file)
    return files


def test_the_heaviest_file_runs_first_and_each_file_stays_whole_and_in_order() -> None:
    order = heavy_files_first(COLLECTED, SECONDS)
    assert sorted(order) == list(range(len(COLLECTED)))
    files = _files(order)
    assert len(files) == len(set(files)), f"a file split in two: {files}"
    assert files == [
        "tests/d/test_bench.py",  # 80 s, one test: xdist's own reorder would put it last
        "tests/b/test_e2e.py",  # 50 s for both parameters, counted once
        "tests/a/test_quick.py",  # 2 s
        "tests/e/test_also_quick.py",  # 1 s
        "tests/c/test_unmeasured.py",  # nothing measured
    ]
    within = [position for position in order if file_of(COLLECTED[position]).endswith("e2e.py")]
    assert within == [2, 3, 4]


def test_files_of_equal_weight_keep_their_collection_order() -> None:
    assert heavy_files_first(COLLECTED, {}) == list(range(len(COLLECTED)))
    weights = file_weights(COLLECTED, SECONDS)
    assert weights["tests/b/test_e2e.py"] == 50.0
    assert weights["tests/c/test_unmeasured.py"] == 0.0


def test_this_session_ran_in_that_order(request: pytest.FixtureRequest) -> None:
    """The collection this worker holds (all the suite's, under xdist) is in the order."""
    nodeids = [item.nodeid for item in request.session.items]
    assert nodeids == [nodeids[i] for i in heavy_files_first(nodeids, measured_seconds())]
    files = [
        file_of(n) for i, n in enumerate(nodeids) if i == 0 or file_of(nodeids[i - 1]) != file_of(n)
    ]
    assert len(files) == len(set(files)), "a file's tests are not together"


def test_xdist_hands_out_files_in_collection_order(request: pytest.FixtureRequest) -> None:
    """Without ``--no-loadscope-reorder`` xdist sorts the files by their number of tests."""
    if not request.config.pluginmanager.hasplugin("xdist"):
        pytest.skip("xdist is not loaded")
    addopts = " ".join(request.config.getini("addopts"))
    assert "--dist loadfile" in addopts
    assert "--no-loadscope-reorder" in addopts
    assert request.config.getoption("loadscopereorder") is False


def test_the_table_names_test_functions_that_exist() -> None:
    defined = set()
    for path in TESTS.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        defined |= set(re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)", text, re.M))
    gone = sorted(set(measured_seconds()) - defined)
    assert not gone, f"tests/durations.txt names tests that no longer exist: {gone}"
