"""The core's public API (``perseus/__init__``).

Every exported name resolves, importing the light parts never loads the solver's heavy dependencies,
and the README's example runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import perseus

ROOT = Path(__file__).resolve().parents[2]
#: The example shown in docs/solver.md and the README, verbatim.
EXAMPLE = """\
import perseus

profile = perseus.load_profile("profiles/gpt3-175b_a100-sxm_8stage.csv")
schedule = perseus.one_f_one_b(8, 12)  # 8 stages, 12 microbatches
frontier = perseus.solve_frontier(profile, schedule, blocking_power=83.64)  # A100 SXM, watts
t0, e0 = frontier.max_frequency_time, frontier.max_frequency_energy  # everything at max clocks

fastest = frontier.points[0]  # the zero-slowdown plan
print(f"T0 {t0:.4f} s, {e0:.0f} J -> fastest plan {fastest.time:.4f} s, {fastest.energy:.0f} J")
i = frontier.index_for_deadline(1.1 * t0)  # the least-energy plan within 10 % of T0
print(frontier.points[i], frontier.plan_steps(i)[0][:2])  # its (T, E, bound), rank 0's first steps
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, from the repository root, on this test's path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("name", perseus.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(perseus, name) is not None
    assert name in dir(perseus)


def test_exports_are_the_defining_modules_objects() -> None:
    from perseus.errors import PerseusError
    from perseus.frontier import FrontierPoint
    from perseus.solver import SolverOptions, solve_frontier

    assert perseus.solve_frontier is solve_frontier
    assert perseus.SolverOptions is SolverOptions
    assert perseus.FrontierPoint is FrontierPoint
    assert perseus.PerseusError is PerseusError
    for name in ("ProfileError", "ScheduleError", "InfeasibleError", "OptionError"):
        assert issubclass(getattr(perseus, name), PerseusError)
        assert issubclass(getattr(perseus, name), ValueError)
    assert issubclass(perseus.SolverCancelled, PerseusError)


def test_all_lists_every_export_once() -> None:
    assert len(set(perseus.__all__)) == len(perseus.__all__)
    assert set(perseus.__all__) == set(perseus._EXPORTS) | {"__version__"}


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = perseus.no_such_thing
    assert not hasattr(perseus, "_kernels")


def test_version_is_a_string() -> None:
    assert isinstance(perseus.__version__, str) and perseus.__version__


def test_light_imports_load_neither_numba_nor_scipy() -> None:
    out = _run(
        "import json, sys\n"
        "import perseus, perseus.profiles, perseus.schedules\n"
        "perseus.Profile, perseus.load_profile, perseus.make_schedule, perseus.ProfileError\n"
        "perseus.__version__\n"
        "light = sorted(m for m in ('numba', 'scipy') if m in sys.modules)\n"
        "perseus.solve_frontier\n"
        "print(json.dumps([light, 'numba' in sys.modules]))\n"
    )
    assert out.returncode == 0, out.stderr
    light, solver_loaded_numba = json.loads(out.stdout)
    assert light == []
    assert solver_loaded_numba  # the solver itself does load its kernels


def test_the_readme_example_runs() -> None:
    out = _run(EXAMPLE)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.startswith("T0 ") and "fastest plan" in first
    assert second.startswith("FrontierPoint(time=")


def test_the_readme_example_is_what_docs_show() -> None:
    assert EXAMPLE in (ROOT / "docs" / "solver.md").read_text()
    assert EXAMPLE in (ROOT / "README.md").read_text()


def test_the_public_api_exports_the_power_names() -> None:
    from perseus import power

    assert perseus.plan_for_power_budget is power.plan_for_power_budget
    assert perseus.allocate_power is power.allocate_power
    assert issubclass(perseus.PowerBudgetError, perseus.InfeasibleError)
