"""Per-clock transfers: the raised bound, the anchored models and the plans.

The bound raised by pricing the producer-transfer coupling stays below every plan, the
anchored model is exact at its plan and never faster elsewhere, and the plans come within
0.5 % of the bound on a small input built like benchmarks/per_clock.py's.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from lp_reference import LPRelaxation

from benchmarks.per_clock import TARGETS, Case, build_problem
from perseus.bound import envelope
from perseus.problem import EnergyProblem
from perseus.schedules import one_f_one_b
from perseus.solver import SolverOptions, solve_problem
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.coupling import Anchoring, anchored, priced, tighten, truth
from perseus.solver.relaxation import Relaxation
from perseus.solver.stages import relax
from perseus_common.communication import Communication, Transfer

FREQS = (1410, 1200, 1020)
A100_BLOCKING_POWER = 83.64  # W, measured with the A100 profile


def _tiny(slice_profile, power_factor: float | None) -> EnergyProblem:
    """A problem of 3**12 plans to enumerate.

    2 stages x 3 microbatches x 3 clocks, both transfers per-clock (a third of their time
    scaling as fmax / f), drawing ``power_factor`` x the blocking power (None: the blocking
    power).
    """
    prof = slice_profile((0, 1), FREQS)
    t = 0.15 * float(prof[(0, "forward")].times[0])
    by = {f: t * (2 / 3 + fmax_over(f) / 3) for f in FREQS}
    power = None if power_factor is None else power_factor * A100_BLOCKING_POWER
    comm = Communication({(0, d): Transfer(t, power, by) for d in ("forward", "backward")}, {})
    return EnergyProblem.build(
        prof.with_communication(comm), one_f_one_b(2, 3), A100_BLOCKING_POWER
    )


def fmax_over(f: int) -> float:
    """``fmax / f`` on the tiny profile's clocks."""
    return FREQS[0] / f


def _every_plan(problem: EnergyProblem) -> tuple[np.ndarray, np.ndarray]:
    """True (time, energy) of every plan of the ops (the other nodes have one option)."""
    ops = problem.num_ops
    combos = np.array(
        list(itertools.product(*[range(int(problem.num_options[v])) for v in range(ops)])),
        dtype=np.uint8,
    )
    plans = np.zeros((len(combos), problem.num_nodes), dtype=np.uint8)
    plans[:, :ops] = combos
    return problem.evaluate_many(plans)


@pytest.mark.parametrize("power_factor", [None, 0.3, 1.25])
def test_the_raised_bound_is_below_the_optimum_and_above_the_plain_one(
    slice_profile, power_factor: float | None
) -> None:
    """The raised bound lies between the plain bound and the optimum.

    Against every plan enumerated: at every deadline the frontier's bound is at most the
    best plan's energy (waiting included) and at least the plain bound (the shortest
    transfers, each transfer's cost at its producer's clock charged to the producer), and
    strictly above it somewhere (the pricing does something).
    """
    problem = _tiny(slice_profile, power_factor)
    times, energies = _every_plan(problem)
    frontier = solve_problem(problem, SolverOptions(effort=0))
    plain = LPRelaxation(problem.cost_charged())
    pr = A100_BLOCKING_POWER * problem.dag.num_ranks
    t0 = frontier.max_frequency_time
    raised = 0
    for d in np.linspace(t0, 1.4 * t0, 25):
        fits = times <= d * (1 + 1e-12)
        best = float(np.min(energies[fits] + pr * (d - times[fits])))
        lb = frontier.lower_bound_at(d)
        assert lb <= best * (1 + 1e-9)
        ref = plain.solve(d).value
        assert lb >= ref * (1 - 1e-7)
        raised += lb > ref * (1 + 1e-5)
    assert raised > 0


def test_a_priced_model_is_the_truth_on_every_real_plan(slice_profile) -> None:
    """A priced model is the truth on every real plan, whatever the prices.

    With the transfers taking their producers' options, its durations and summed effective
    costs are the truth's.
    """
    problem = _tiny(slice_profile, 1.25)
    rng = np.random.default_rng(3)
    model = priced(problem, rng.uniform(0, 5000, len(problem.clocked_transfers)))
    plans = rng.integers(0, problem.num_options[None, :], size=(30, problem.num_nodes))
    plans = plans.astype(np.uint8)
    t, e = problem.evaluate_many(plans)
    coupled = plans.astype(np.int64)
    coupled[:, problem.clocked_transfers] = coupled[:, problem.clocked_producers]
    rows = np.arange(problem.num_nodes)[None, :]
    d = model.times[rows, coupled]
    cost = (model.energies - A100_BLOCKING_POWER * model.times)[rows, coupled].sum(axis=1)
    pr = A100_BLOCKING_POWER * problem.dag.num_ranks
    np.testing.assert_allclose(problem.dag.iteration_time(d), t, rtol=1e-12)
    np.testing.assert_allclose(cost + pr * t, e, rtol=1e-9)


def test_an_anchored_model_is_exact_at_its_plan_and_never_faster(slice_profile) -> None:
    """An anchored model is exact at its plan and never faster than the truth elsewhere.

    The anchored model of a plan gives that plan its true time and every other plan at least
    its true time, at the truth's effective costs; the fast per-plan rounder
    (:class:`Anchoring`) has the same times, in its sorted order.
    """
    problem = _tiny(slice_profile, 1.25)
    rng = np.random.default_rng(5)
    plans = rng.integers(0, problem.num_options[None, :], size=(30, problem.num_nodes))
    plans = plans.astype(np.uint8)
    t_true, e_true = problem.evaluate_many(plans)
    fast = Anchoring(problem.producer_charged())
    assert fast.problem.times is problem.times  # the truth behind the planning model
    rows = np.arange(problem.num_nodes)
    pr = A100_BLOCKING_POWER * problem.dag.num_ranks
    for plan in plans[:6]:
        model = anchored(problem, plan)
        d = model.times[rows[None, :], plans.astype(np.int64)]
        t_model = problem.dag.iteration_time(d)
        assert (t_model >= t_true * (1 - 1e-12)).all()
        at = problem.evaluate(plan)
        assert problem.dag.iteration_time(model.times[rows, plan]) == pytest.approx(at.time)
        eff = (model.energies - A100_BLOCKING_POWER * model.times)[rows, plan].sum()
        assert eff + pr * at.time == pytest.approx(at.energy, rel=1e-12)
        r = fast.rounder_for(plan)
        want = np.take_along_axis(model.times, r.order, axis=1)
        valid = np.arange(want.shape[1])[None, :] < r.nopt[:, None]
        np.testing.assert_allclose(r.times[valid], want[valid], rtol=1e-12)
    assert truth(problem) is problem


def test_the_envelope_is_the_pointwise_maximum() -> None:
    """The envelope's breakpoints give the pointwise maximum exactly.

    Of random convex piecewise-linear functions, by interpolation, on a fine grid and past
    every function's last breakpoint.
    """
    rng = np.random.default_rng(7)
    curves = []
    for _ in range(4):
        t = np.r_[1.0, np.sort(rng.uniform(1.0, 3.0, 6))]
        slopes = np.sort(rng.uniform(-50, 5, len(t) - 1))
        v = np.r_[0.0, np.cumsum(slopes * np.diff(t))] + rng.uniform(0, 10)
        curves.append((t, v))
    tail = 10.0
    times, values = envelope(curves, tail)
    grid = np.linspace(1.0, 4.0, 3001)

    def f(t: np.ndarray, v: np.ndarray, x: np.ndarray) -> np.ndarray:
        y = np.interp(x, t, v)
        return np.where(x > t[-1], v[-1] + tail * (x - t[-1]), y)

    want = np.max([f(t, v, grid) for t, v in curves], axis=0)
    np.testing.assert_allclose(f(times, values, grid), want, rtol=1e-12, atol=1e-9)


def test_plans_within_half_a_percent_of_the_bound_with_per_clock_transfers() -> None:
    """Plans come within 0.5 % of the bound at the five target deadlines.

    GPT-3 A40, 4 stages x 4 microbatches 1F1B, transfers of 1-5 % of the sending stage's
    forward, half scaling as fmax / f: the plans within 0.5 % of the certified bound at 1.0,
    1.02, 1.05, 1.1 and 1.2 T0 (0.57 % at 1.02 T0 when planned on the producer-charged model
    against the plain bound).
    """
    problem = build_problem(Case("small", "a40", 4, 4))
    frontier = solve_problem(problem, SolverOptions())
    t0 = frontier.max_frequency_time
    t, e = problem.evaluate_many(frontier.plans)
    np.testing.assert_allclose(frontier.times, t, rtol=1e-12)
    np.testing.assert_allclose(frontier.energies, e, rtol=1e-12)
    for f in TARGETS:
        d = f * t0
        assert frontier.energy_at(d) <= frontier.lower_bound_at(d) * 1.005, f
    # and the bound is a bound: below the plain one nowhere
    plain = relax(problem.cost_charged())
    grid = np.linspace(t0, 1.4 * t0, 50)
    assert (frontier.relaxed_bound.bound(grid) >= plain.bound(grid) * (1 - 1e-9)).all()


def test_large_problems_keep_the_plain_bound(slice_profile) -> None:
    """Below four sweeps' worth of ``sweep_work`` the plain bound is kept as it is."""
    problem = _tiny(slice_profile, None)
    plain = relax(problem.cost_charged())

    def sweep(p: EnergyProblem, r: Relaxation) -> RelaxedFrontier:
        return relax(p, relaxation=r)

    n = problem.num_nodes
    assert tighten(problem, plain, sweep, sweep_work=3 * n) is plain
    raised = tighten(problem, plain, sweep, sweep_work=40 * n)
    assert raised is not plain
    grid = np.linspace(plain.t_min, plain.t_max, 200)
    assert (raised.bound(grid) >= plain.bound(grid) * (1 - 1e-12)).all()
