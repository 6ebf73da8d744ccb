"""``testing/fault_hooks.py``: what a test installs in the server's fault points.

The environment :func:`server_env` builds is what the seam (``runtime/faults.py``) reads in the
server it starts, and :func:`installed` leaves nothing behind, however its block ends. The seam's
own behaviour is tested in ``tests/server/runtime/test_faults.py``.
"""

from __future__ import annotations

import pytest

from perseus_server.runtime import faults
from perseus_server.testing.fault_hooks import (
    FAULT_ENV,
    POINTS,
    TEST_SOLVE_DELAY_ENV,
    TEST_WARM_DELAY_ENV,
    installed,
    server_env,
)


def test_server_env_names_only_what_it_is_given() -> None:
    assert server_env() == {}
    point = sorted(POINTS)[0]
    assert server_env(stop_at=point, solve_delay=1.5, warm_delay=0) == {
        FAULT_ENV: point,
        TEST_SOLVE_DELAY_ENV: "1.5",
        TEST_WARM_DELAY_ENV: "0",
    }


def test_server_env_refuses_a_point_that_does_not_exist() -> None:
    with pytest.raises(ValueError, match="stop_at: no such point: 'after_solve_comit'"):
        server_env(stop_at="after_solve_comit")


def test_the_seam_reads_the_delays_server_env_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in server_env(solve_delay=2.5, warm_delay=0.25).items():
        monkeypatch.setenv(name, value)
    assert faults.test_delay(TEST_SOLVE_DELAY_ENV) == 2.5
    assert faults.test_delay(TEST_WARM_DELAY_ENV) == 0.25


def test_installed_hooks_are_gone_after_a_block_that_raised() -> None:
    reached: list[str] = []
    point = sorted(POINTS)[0]
    with pytest.raises(KeyError), installed({point: lambda: reached.append(point)}):
        faults.fault_point(point)
        raise KeyError("the test's own failure")
    faults.fault_point(point)  # uninstalled: the hook is not called again
    assert reached == [point]
