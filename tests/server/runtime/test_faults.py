"""The fault points' seam (``perseus_server.runtime.faults``): inert until a test installs hooks.

The crash tests (``test_faults_crashes.py``) stop a real server at each point through its environment;
these check the seam itself: hooks installed in this process run where production reaches a
point, the environment still reaches a fresh process, and names that do not exist are refused.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from perseus_server.runtime import faults
from perseus_server.testing.fault_hooks import (
    FAULT_ENV,
    FAULT_EXIT_CODE,
    POINTS,
    TEST_SOLVE_DELAY_ENV,
    TEST_WARM_DELAY_ENV,
    installed,
)


def test_without_hooks_every_point_and_phase_is_inert(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (FAULT_ENV, TEST_SOLVE_DELAY_ENV, TEST_WARM_DELAY_ENV):
        monkeypatch.delenv(name, raising=False)
    for point in POINTS:
        faults.fault_point(point)  # returns: nothing installed
    assert faults.test_delay(TEST_SOLVE_DELAY_ENV) == 0.0


def test_an_installed_hook_runs_where_its_point_is_reached() -> None:
    reached: list[str] = []
    with installed({"after_solve_commit": lambda: reached.append("solve")}):
        faults.fault_point("after_frontier_store")
        faults.fault_point("after_solve_commit")
    faults.fault_point("after_solve_commit")  # uninstalled on leaving
    assert reached == ["solve"]


def test_a_hook_that_raises_stops_the_step_there() -> None:
    class Stop(Exception):
        pass

    def stop() -> None:
        raise Stop

    with installed({"after_deployment_store": stop}), pytest.raises(Stop):
        faults.fault_point("after_deployment_store")


def test_installed_delays_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_WARM_DELAY_ENV, "9")
    with installed(delays={TEST_WARM_DELAY_ENV: 2.5}):
        assert faults.test_delay(TEST_WARM_DELAY_ENV) == 2.5
    assert faults.test_delay(TEST_WARM_DELAY_ENV) == 9.0
    monkeypatch.setenv(TEST_WARM_DELAY_ENV, "soon")
    assert faults.test_delay(TEST_WARM_DELAY_ENV) == 0.0  # unreadable: no delay


@pytest.mark.parametrize(
    ("points", "delays", "named"),
    [({"after_solve_comit": lambda: None}, None, "after_solve_comit"), (None, {"WARM": 1}, "WARM")],
)
def test_a_hook_for_nothing_is_refused(points: object, delays: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        faults.install(points, delays)  # type: ignore[arg-type]


def test_the_environment_stops_a_fresh_process_at_its_point() -> None:
    code = (
        "from perseus_server.runtime.faults import fault_point\n"
        "fault_point('after_profile_store')\n"
        "print('passed', flush=True)\n"
        "fault_point('after_profiling_commit')\n"
        "print('not reached')\n"
    )
    env = {FAULT_ENV: "after_profiling_commit", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**env, "PYTHONPATH": ":".join(sys.path)},
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (FAULT_EXIT_CODE, "passed\n"), out.stderr
