"""The solver tests' shared instances and checks (a helper beside them, like ``lp_reference``).

``smooth``: a DVFS-model profile of any size; ``check_frontier``: a frontier's plans re-evaluated
and its bounds checked; ``instances``: random profiles and schedules for property tests;
``knapsack_problem``: a 2-stage chain with a discrete plan between two relaxed breakpoints;
``waiting_energy``: what a frontier is Pareto-optimal in, with time.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import (
    InstructionProfile,
    Profile,
    parse_profile_csv,
    parse_profile_json,
)
from perseus.schedules import Schedule, make_schedule, one_f_one_b

REL = 1e-9


def smooth(stages: int, clocks: int, seed: int = 0) -> Profile:
    """A DVFS-model profile, stages a little different from each other.

    Time = memory part + compute part x fmax/f, power = static + dynamic x (f/fmax)^3.
    """
    rng = np.random.default_rng(seed)
    f = 1980 - 15 * np.arange(clocks)
    x = f / f[0]
    entries = {}
    for s in range(stages):
        w = 1 + 0.1 * rng.random()
        for kind, mult in (("forward", 1.0), ("backward", 2.0)):
            t = mult * w * (0.008 + 0.04 / x)
            e = (90 + 310 * x ** (2.5 + rng.random())) * t
            entries[(s, kind)] = InstructionProfile(f.astype(np.int64), t, e)
    return Profile(entries)


def check_frontier(problem: EnergyProblem, fr: Frontier) -> None:
    t, e = problem.evaluate_many(fr.plans)
    assert np.allclose(t, fr.times, rtol=REL) and np.allclose(e, fr.energies, rtol=REL)
    assert fr.times[0] <= fr.max_frequency_time * (1 + REL)
    assert np.all(fr.lower_bounds <= fr.energies * (1 + REL))
    assert fr.plans.dtype == np.uint8


@st.composite
def instances(
    draw: st.DrawFn,
    names: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b"),
    max_microbatches: int = 4,
    max_freqs: int = 5,
) -> tuple[Profile, Schedule, float]:
    """A random profile and schedule, and a blocking power.

    The profile has 2-3 stages and 2-5 frequencies, each (stage, kind) measuring a subset, time
    increasing as the frequency drops, 30-400 W.
    """
    name = draw(st.sampled_from(names))
    ranks = draw(st.integers(2, 3))
    if name == "interleaved-1f1b":
        virtual = 2
        microbatches = ranks * draw(st.integers(1, 4 // ranks))
        profile_stages = draw(st.sampled_from([ranks, ranks * virtual]))
    else:
        virtual = 1
        microbatches = draw(st.integers(1, max_microbatches))
        profile_stages = ranks
    schedule = make_schedule(name, ranks, microbatches, virtual)
    nfreq = draw(st.integers(2, max_freqs))
    freqs = draw(st.lists(st.integers(200, 2000), min_size=nfreq, max_size=nfreq, unique=True))
    positive = st.floats(0.001, 0.05, allow_nan=False)
    records = []
    for s in range(profile_stages):
        for kind in ("forward", "backward"):
            # each (stage, kind) measures a non-empty subset of the frequencies
            mine = sorted(
                draw(st.lists(st.sampled_from(freqs), min_size=1, max_size=nfreq, unique=True)),
                reverse=True,
            )
            t = draw(st.floats(0.005, 0.1))
            for j, f in enumerate(mine):
                if j:
                    t += draw(positive)  # slower at a lower frequency
                watts = draw(st.floats(30.0, 400.0))
                records.append(
                    {
                        "stage": s,
                        "instruction": kind,
                        "frequency": f,
                        "time": t,
                        "energy": t * watts,
                    }
                )
    power = draw(st.floats(0.0, 250.0))
    return parse_profile_json({"records": records}), schedule, power


#: A 2-stage, 1-microbatch chain (P = 0): stage 0's backward saves 6.2 J for 4.2 ms at 400 MHz,
#: stage 1's forward 2.0 J for 1 ms. The relaxation shortens the cheaper-per-second backward
#: first, so its breakpoints are (0.1927 s, 22.2 J), (0.1937 s, 20.2 J) and (0.1979 s, 14.0 J);
#: the discrete plan with only the backward slowed (0.1969 s, 16.0 J) lies between them.
KNAPSACK_CSV = """stage,instruction,frequency,time,energy
0,forward,1800,0.060,1.8
0,backward,1800,0.0255,8.3
0,backward,400,0.0297,2.1
1,forward,1800,0.0246,2.8
1,forward,400,0.0256,0.8
1,backward,1800,0.0826,9.3
"""


def knapsack_problem() -> EnergyProblem:
    return EnergyProblem.build(parse_profile_csv(KNAPSACK_CSV), one_f_one_b(2, 1), 0.0)


def waiting_energy(frontier: Frontier) -> np.ndarray:
    """``energy - P R time``: the quantity the frontier is Pareto-optimal in (with time)."""
    return frontier.energies - frontier.blocking_power * frontier.schedule.ranks * frontier.times
