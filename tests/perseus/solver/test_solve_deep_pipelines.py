"""Deep pipelines (16-32 stages, few microbatches).

The relaxed sweep's certified bound against the independent LP (``tests/perseus/lp_reference.py``),
for every schedule kind and for fine-grained clocks (swept on thinned hulls), and every frontier
point truly evaluated.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lp_reference import lp_lower_bound
from solver_instances import check_frontier, smooth

from perseus.problem import EnergyProblem
from perseus.profiles import InstructionProfile, Profile
from perseus.schedules import gpipe, interleaved_1f1b, one_f_one_b
from perseus.solver import SolverOptions, solve_problem

DEADLINES = (1.0, 1.02, 1.1, 1.3)


def stepped(stages: int, clocks: int, seed: int) -> Profile:
    """Measured-looking options.

    Random times and energies per clock (not on a smooth curve, so only some clocks are on the
    hull, and the Pareto filter drops some), stages unlike each other.
    """
    rng = np.random.default_rng(seed)
    entries = {}
    for s in range(stages):
        for kind, mult in (("forward", 1.0), ("backward", 2.0)):
            t = mult * np.sort(0.01 + 0.02 * rng.random(clocks))
            e = t * (300 - 150 * (t - t.min()) / (np.ptp(t) + 1e-12)) * (1 + 0.05 * rng.random())
            f = (1980 - 15 * np.arange(clocks)).astype(np.int64)
            entries[(s, kind)] = InstructionProfile(f, t, e)
    return Profile(entries)


def _check_bound(problem: EnergyProblem, opts: SolverOptions, slack: float) -> None:
    """Check every point against its bound and the bound against the LP.

    Every point above its bound, the fastest within T0, and the bound at each deadline at most
    the LP's and at least the LP's less ``slack`` (a share of the nodes' least energies).
    """
    fr = solve_problem(problem, opts)
    check_frontier(problem, fr)
    valid = np.arange(problem.energies.shape[1])[None, :] < problem.num_options[:, None]
    loose = slack * float(np.where(valid, problem.energies, np.inf).min(axis=1).sum())
    for f in DEADLINES:
        d = max(f * fr.max_frequency_time, float(fr.bound_times[0]))
        ref = lp_lower_bound(problem, d).value
        got = fr.lower_bound_at(d)
        assert got <= ref * (1 + 1e-7)
        assert got >= ref - loose - 1e-7 * ref


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["1f1b", "gpipe", "interleaved"]),
    st.integers(16, 32),
    st.integers(3, 10),
    st.floats(20.0, 120.0),
    st.integers(0, 2**16),
)
def test_deep_schedules_bound_equals_the_lp(
    kind: str, stages: int, clocks: int, power: float, seed: int
) -> None:
    """Coarse measured profiles (swept exactly): the bound is the LP's at every deadline.

    (Interleaving needs as many microbatches as stages: 16 stages keep it at 1,024 nodes.)
    """
    if kind == "interleaved":
        stages = 16
        schedule = interleaved_1f1b(stages, stages, 2)
    elif kind == "gpipe":
        schedule = gpipe(stages, 2)
    else:
        schedule = one_f_one_b(stages, 3)
    problem = EnergyProblem.build(stepped(stages, clocks, seed), schedule, power)
    _check_bound(problem, SolverOptions(effort=0.0), 0.0)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(16, 24), st.integers(1, 2), st.integers(0, 2**16))
def test_deep_fine_grained_bound_is_certified_within_the_tolerance(
    stages: int, microbatches: int, seed: int
) -> None:
    """A smooth 40-clock profile.

    The sweep runs on thinned hulls; its bound is below the LP on the exact hulls and within
    ``hull_tolerance`` of the energy of it.
    """
    tol = 1e-3
    problem = EnergyProblem.build(smooth(stages, 40, seed), one_f_one_b(stages, microbatches), 80.0)
    _check_bound(problem, SolverOptions(effort=0.0, hull_tolerance=tol), tol)


@pytest.mark.parametrize("stages", [16, 32])
def test_deep_single_microbatch_is_a_chain(stages: int) -> None:
    """One microbatch through 16 or 32 stages is one path.

    The bound is the LP's, and at T0 the only plan is the all-max-frequency one (nothing can
    slow without delaying the end).
    """
    problem = EnergyProblem.build(stepped(stages, 6, stages), one_f_one_b(stages, 1), 60.0)
    fr = solve_problem(problem, SolverOptions(effort=0.0))
    check_frontier(problem, fr)
    t0 = fr.max_frequency_time
    assert fr.lower_bound_at(t0) == pytest.approx(lp_lower_bound(problem, t0).value, rel=1e-7)
    assert fr.energy_at(t0) == pytest.approx(fr.lower_bound_at(t0), rel=1e-9)
