"""The core's exception hierarchy (``perseus.errors``), as its callers rely on it.

Every error raised on bad input is a :class:`PerseusError` and a ``ValueError`` (the server maps
``ValueError`` to a 4xx; a caller that knows only the built-ins still catches it) and keeps what
it names apart for structured reports; a cancel is neither bad input nor a ``ValueError``. Each is
raised here by the real code path that raises it, not constructed by hand.
"""

from __future__ import annotations

import pytest

from perseus.errors import (
    InfeasibleError,
    OptionError,
    PerseusError,
    ProfileError,
    ScheduleError,
    SolverCancelled,
)
from perseus.frontier import Frontier
from perseus.profiles import parse_profile_csv
from perseus.schedules import make_schedule, one_f_one_b
from perseus.solver import SolverOptions, solve_frontier
from perseus_common.located_error import LocatedError

#: One stage, one clock: a frontier of a single point (1.0 s) in no time.
ONE_POINT = """stage,instruction,frequency,time,energy
0,forward,1410,0.4,40.0
0,backward,1410,0.6,60.0
"""


def one_point() -> Frontier:
    return solve_frontier(parse_profile_csv(ONE_POINT), one_f_one_b(1, 1), 80.0)


def test_a_malformed_profile_names_its_row_and_field() -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile_csv(ONE_POINT.replace("0.6,60.0", "-0.6,60.0"))
    assert isinstance(err.value, PerseusError) and isinstance(err.value, ValueError)
    assert isinstance(err.value, LocatedError)
    assert (err.value.row, err.value.field) == (3, "time")
    assert str(err.value).startswith("row 3, field 'time': ")
    assert err.value.detail and err.value.detail in str(err.value)


def test_an_unknown_schedule_is_a_schedule_error_naming_it() -> None:
    with pytest.raises(ScheduleError, match="zigzag") as err:
        make_schedule("zigzag", 2, 2)
    assert isinstance(err.value, PerseusError) and isinstance(err.value, ValueError)


def test_a_deadline_no_plan_meets_is_infeasible() -> None:
    fr = one_point()
    assert fr.index_for_deadline(float(fr.times[0])) == 0
    with pytest.raises(InfeasibleError) as err:
        fr.index_for_deadline(0.5 * float(fr.times[0]))
    assert isinstance(err.value, PerseusError) and isinstance(err.value, ValueError)


def test_an_option_error_carries_the_option_it_names() -> None:
    with pytest.raises(OptionError, match="effort") as err:
        SolverOptions(effort=-1.0)
    assert err.value.field == "effort"
    assert isinstance(err.value, PerseusError) and isinstance(err.value, ValueError)
    assert OptionError("no field here").field is None


def test_a_cancel_is_a_perseus_error_but_not_bad_input() -> None:
    with pytest.raises(SolverCancelled) as err:
        solve_frontier(parse_profile_csv(ONE_POINT), one_f_one_b(1, 1), 80.0, cancel=lambda: True)
    assert isinstance(err.value, PerseusError)
    assert not isinstance(err.value, ValueError)  # a ValueError handler must not swallow it
