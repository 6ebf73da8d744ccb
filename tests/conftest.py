"""Fixtures shared by every test (the core's in ``tests/perseus/``, each app's in its own folder).

The real profiles in ``profiles/``, a way to cut them down to a few stages and frequencies for
small, fast instances, and the project built as a wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from file_order import heavy_files_first, measured_seconds

from perseus.profiles import Profile, load_profile, parse_profile_csv

# Servers the tests start skip warming the solver kernels (setup compiled them already; the
# warm-up test turns it on itself): a test that solves at once then does not wait for it.
os.environ.setdefault("PERSEUS_WARM_KERNELS", "0")

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files that take longest first, each file's tests together (``file_order.py``)."""
    order = heavy_files_first([item.nodeid for item in items], measured_seconds())
    items[:] = [items[i] for i in order]


A100_CSV = ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv"
#: Blocking power (W) measured with the A100 profile.
A100_BLOCKING_POWER = 83.64


@pytest.fixture(scope="session")
def a100() -> Profile:
    """The real GPT-3 175B A100 profile (8 stages, 38 frequencies)."""
    return load_profile(A100_CSV)


@pytest.fixture(scope="session")
def slice_profile(a100: Profile) -> Callable[[Iterable[int], Iterable[int] | None], Profile]:
    """``slice_profile(stages, freqs)``: the A100 profile cut down.

    The A100 profile cut to the given stages (renumbered 0..k-1 in the given order) and
    frequencies (``None``: all of them).
    """

    def cut(stages: Iterable[int], freqs: Iterable[int] | None = None) -> Profile:
        renumber = {s: i for i, s in enumerate(stages)}
        keep = None if freqs is None else set(freqs)
        lines = ["stage,instruction,frequency,time,energy"]
        for r in a100.records():
            if r["stage"] in renumber and (keep is None or r["frequency"] in keep):
                lines.append(
                    f"{renumber[r['stage']]},{r['instruction']},{r['frequency']},"
                    f"{r['time']!r},{r['energy']!r}"
                )
        return parse_profile_csv("\n".join(lines) + "\n")

    return cut


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel, from a clean copy of the tree.

    A build in the checkout would reuse whatever an earlier build left in ``build/``.
    """
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 68:
        pytest.skip(f"building needs setuptools >= 68, not {setuptools.__version__}")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("perseus", "server", "client", "gpud", "common", "demo", "profiles"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
    wheels = tmp / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("perseus-*.whl")
    return wheel
