"""The order the suite's files run in: those that take longest first, each file's tests together.

The suite runs on three xdist workers with ``--dist loadfile --no-loadscope-reorder``: xdist
groups the collected tests by file and hands the next whole file, in collection order, to the
first worker that runs low (without ``--no-loadscope-reorder`` it would sort the files by how
many tests they hold, which puts a file of one long end-to-end test last). A long file collected
late then runs while the other workers, done, sit idle; started first, it runs beside the many
short files. ``tests/conftest.py`` reorders the collection with :func:`heavy_files_first` (the
longest-processing-time-first rule), and every worker collects the same files, so every worker
computes the same order, as xdist requires.

A file's weight is the sum of its test functions' seconds in ``tests/durations.txt``, which names
functions, not files: a test moved to another file takes its weight with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

#: Measured seconds per test function (see the file's header).
DURATIONS = Path(__file__).resolve().with_name("durations.txt")


def measured_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """The seconds per test function name in ``path`` (lines ``SECONDS NAME``, ``#`` comments).

    Args:
        path: The table to read.

    Returns:
        Test function name -> seconds.
    """
    seconds: dict[str, float] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            value, name = fields
            seconds[name] = float(value)
    return seconds


def file_of(nodeid: str) -> str:
    """The file a test's node id belongs to (xdist's ``loadfile`` group)."""
    return nodeid.split("::", 1)[0]


def function_of(nodeid: str) -> str:
    """The test function's name in a node id, without class or parameters."""
    return nodeid.rsplit("::", 1)[-1].split("[", 1)[0]


def file_weights(nodeids: Sequence[str], seconds: Mapping[str, float]) -> dict[str, float]:
    """Each file's weight: its test functions' seconds, each function counted once.

    Args:
        nodeids: The collected tests' node ids.
        seconds: Seconds per test function name (summed over its parameters).

    Returns:
        File -> seconds (0 for a file none of whose functions is in ``seconds``).
    """
    weights: dict[str, float] = {}
    counted: set[tuple[str, str]] = set()
    for nodeid in nodeids:
        file, function = file_of(nodeid), function_of(nodeid)
        weights.setdefault(file, 0.0)
        if (file, function) not in counted:
            counted.add((file, function))
            weights[file] += seconds.get(function, 0.0)
    return weights


def heavy_files_first(nodeids: Sequence[str], seconds: Mapping[str, float]) -> list[int]:
    """The positions of ``nodeids`` in run order: the heaviest file first, files kept whole.

    A stable order: files of equal weight keep their collection order, and every file's tests
    keep theirs.

    Args:
        nodeids: The collected tests' node ids, in collection order.
        seconds: Seconds per test function name.

    Returns:
        A permutation of ``range(len(nodeids))``.
    """
    weights = file_weights(nodeids, seconds)
    first: dict[str, int] = {}
    for position, nodeid in enumerate(nodeids):
        first.setdefault(file_of(nodeid), position)

    def key(position: int) -> tuple[float, int, int]:
        file = file_of(nodeids[position])
        return (-weights[file], first[file], position)

    return sorted(range(len(nodeids)), key=key)
