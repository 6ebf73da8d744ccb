"""The sweep records its breakpoints in order, even across a degenerate step.

The case measured in issue 34's work (A100 tiled 16 x 64 1F1B, per-clock transfers of 3 % of a
forward, the planning model): a step that moved some nodes by 2e-12 s ended with a longest path
4.4e-14 s *longer* than the step before it, and the refinement then failed on breakpoint times
out of order. ``data/sweep_degenerate_start.npy`` holds the relaxed durations at the breakpoint
two steps before it (an optimal start, taken from the whole sweep), so the case replays in 17
steps instead of the 7,600 that lead there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.communication import with_transfers
from perseus.bound import RelaxedBound
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, load_profile
from perseus.schedules import one_f_one_b
from perseus.solver.relaxation import Relaxation, sweep_range

ROOT = Path(__file__).resolve().parents[3]
START = Path(__file__).with_name("data") / "sweep_degenerate_start.npy"


def _planning_model() -> EnergyProblem:
    """The A100 16 x 64 planning model of the measured case (as ``benchmarks/scaling.py``)."""
    base = load_profile(ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv")
    tiled = Profile({(s, k): base[(s % base.stages, k)] for s in range(16) for k in base.kinds})
    profile = with_transfers(tiled, 0.03, clocked=True)
    problem = EnergyProblem.build(profile, one_f_one_b(16, 64), 83.64)
    return problem.cost_charged().producer_charged()


def test_a_degenerate_step_is_recorded_in_order() -> None:
    """From the stored start, the sweep's times never rise, and the degenerate step is met.

    The step that ends later than the one before it is recorded at that one's time (so two
    consecutive times are equal), and the breakpoints are a valid bound as they come.
    """
    problem = _planning_model()
    rel = Relaxation.build(problem)
    start = np.load(START)
    assert start.shape == (problem.num_nodes,)
    t_start = float(problem.dag.iteration_time(start))
    times, costs, _, _ = sweep_range(problem, rel, memory=2**20, start=start, t_stop=13.11)
    assert len(times) >= 3 and times[-1] == t_start
    assert (np.diff(times) >= 0).all(), "breakpoint times out of order"
    # the degenerate step was replayed: it is recorded at the time of the step before it
    assert (np.diff(times) == 0).any()
    bound = RelaxedBound.breakpoints(times, costs + 83.64 * 16 * times, 83.64 * 16)
    assert np.isfinite(bound.bound(times)).all()
