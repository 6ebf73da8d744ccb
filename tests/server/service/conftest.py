"""Shared fixtures of the service tests: a two-stage job's profile and its solved frontier."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from perseus.frontier import Frontier
from perseus.profiles import Profile
from perseus.schedules import one_f_one_b
from perseus.solver import solve_frontier

#: The job's blocking power (W), as a measured A40's.
BLOCKING = 83.64
Slicer = Callable[[Iterable[int], Iterable[int] | None], Profile]


@pytest.fixture(scope="module")
def profile(slice_profile: Slicer) -> Profile:
    """Two stages of the measured profile at four clocks."""
    return slice_profile([0, 1], {1410, 1200, 1005, 855})


@pytest.fixture(scope="module")
def frontier(profile: Profile) -> Frontier:
    """``profile``'s frontier for 1F1B with 4 microbatches."""
    return solve_frontier(profile, one_f_one_b(2, 4), BLOCKING)
