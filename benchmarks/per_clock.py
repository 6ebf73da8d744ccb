"""Plans against the certified bound when transfer times depend on the producer's clock.

Inputs (built here from the shipped profiles, nothing to download): the first ``stages``
stages of the GPT-3 175B profile on A40 or A100 SXM, 1F1B; every boundary's forward and
backward transfer takes 1-5 % of the sending stage's forward time at its highest clock (spread
evenly over the boundaries, 1 % at the first, 5 % at the last), half of it scaling as
``fmax / f`` with the clock of the instruction that produced the data. Variants: ``hot`` (the
transfers of boundary 1 draw 1.25 x the blocking power) and ``bloom`` (6 stages: a deeper
pipeline standing in for the Bloom inputs, whose profile is not shipped).

For each input (solved with ``SolverOptions(effort=...)``, default 1): the gaps of the frontier's
plans to its certified bound at 1.0, 1.02, 1.05, 1.1 and 1.2 T0 (a plan that finishes early pays
blocking power until the deadline), the worst over 400 deadlines from T0 to 1.5 T0, and the solve's
wall time.

    python benchmarks/per_clock.py            # every input (about 30 s of CPU each)
    python benchmarks/per_clock.py --smoke    # one small input (seconds; a test runs it)
    python benchmarks/per_clock.py --only gpt3-a40

The run ends with ``OK`` when every gap (the worst over the range included) is within
``GAP_GOAL``, else ``FAIL`` and exit status 1 (``--smoke``: the figures only, exit status 0).
The exact MILP on these inputs: ``benchmarks/milp_check.py --per-clock CASE``.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from perseus.frontier import Frontier  # noqa: E402
from perseus.problem import EnergyProblem  # noqa: E402
from perseus.profiles import Profile, load_profile  # noqa: E402
from perseus.schedules import one_f_one_b  # noqa: E402
from perseus.solver import SolverOptions, solve_problem  # noqa: E402
from perseus_common.communication import Communication, Transfer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GPUS = {
    "a100": (ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv", 83.64),
    "a40": (ROOT / "profiles" / "gpt3-175b_a40_8stage.csv", 70.38),
}
TARGETS = (1.0, 1.02, 1.05, 1.1, 1.2)
GAP_GOAL = 0.005
#: Deadlines from T0 to 1.5 T0 over which the worst gap is taken.
SWEEP_POINTS = 400


@dataclass(frozen=True)
class Case:
    """One input: a GPU's profile cut to ``stages`` stages, ``microbatches`` of 1F1B."""

    name: str
    gpu: str
    stages: int
    microbatches: int
    hot: bool = False  # boundary 1's transfers draw 1.25 x the blocking power
    scale: float = 1.0  # transfers as a share of the forward, times this


CASES = (
    Case("gpt3-a40", "a40", 4, 12),
    Case("gpt3-a40-hot", "a40", 4, 12, hot=True),
    Case("gpt3-a100", "a100", 4, 12),
    Case("bloom-a40", "a40", 6, 12, scale=1.0),
    Case("bloom-a100", "a100", 6, 12, hot=True),
)
SMOKE = Case("smoke-a40", "a40", 4, 4)


def build_problem(case: Case) -> EnergyProblem:
    """The case's problem: profile, per-clock transfers, 1F1B schedule."""
    path, power = GPUS[case.gpu]
    base = load_profile(path)
    profile: Profile = base.select_stages(range(case.stages))
    transfers = {}
    fractions = np.linspace(0.01, 0.05, case.stages - 1) * case.scale
    for b, frac in enumerate(fractions):
        fwd = profile[(b, "forward")]
        t = float(frac) * float(fwd.times[0])
        fmax = int(fwd.frequencies[0])
        by = {int(f): t * (0.5 + 0.5 * fmax / int(f)) for f in fwd.frequencies}
        p = 1.25 * power if case.hot and b == 1 else None
        for d in ("forward", "backward"):
            transfers[(b, d)] = Transfer(t, p, by)
    profile = profile.with_communication(Communication(transfers, {}))
    return EnergyProblem.build(profile, one_f_one_b(case.stages, case.microbatches), power)


def gaps(frontier: Frontier) -> tuple[list[float], float]:
    """The gaps at ``TARGETS`` x T0 and the worst over ``SWEEP_POINTS`` deadlines."""
    t0 = frontier.max_frequency_time

    def gap(d: float) -> float:
        return frontier.energy_at(d) / frontier.lower_bound_at(d) - 1

    at = [gap(f * t0) for f in TARGETS]
    worst = max(gap(d) for d in np.linspace(t0, 1.5 * t0, SWEEP_POINTS))
    return at, worst


def run_case(case: Case, options: SolverOptions) -> tuple[list[float], float, float, int]:
    """The case's gaps, worst gap, solve seconds and node count."""
    problem = build_problem(case)
    start = time.perf_counter()
    frontier = solve_problem(problem, options)
    seconds = time.perf_counter() - start
    at, worst = gaps(frontier)
    return at, worst, seconds, problem.num_nodes


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 1 when a gap is above the goal."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--smoke", action="store_true", help="one small input")
    ap.add_argument("--only", action="append", help="run only these cases (by name)")
    ap.add_argument("--effort", type=float, default=1.0)
    args = ap.parse_args(argv)
    cases = [SMOKE] if args.smoke else [c for c in CASES if not args.only or c.name in args.only]
    options = SolverOptions(effort=args.effort)
    cols = " / ".join(f"{f:g}" for f in TARGETS)
    print(f"| input | nodes | gaps at {cols} T0 | worst (1-1.5 T0) | solve s |")
    print("|---|---|---|---|---|")
    ok = True
    for case in cases:
        at, worst, seconds, n = run_case(case, options)
        ok &= worst <= GAP_GOAL and all(g <= GAP_GOAL for g in at)
        cells = " / ".join(f"{100 * g:.2f}" for g in at)
        print(f"| {case.name} {case.stages}x{case.microbatches} | {n} | {cells} % "
              f"| {100 * worst:.2f} % | {seconds:.1f} |", flush=True)  # fmt: skip
    print("OK" if ok else "FAIL")
    return 0 if ok or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
