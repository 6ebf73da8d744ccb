"""How much of the gap to the lower bound is the bound's: the exact discrete optimum at a deadline,
from HiGHS's MILP solver, beside Perseus's plan and the convex-relaxation bound.

    python benchmarks/milp_check.py [--gpu a40] [--microbatches 12] [--deadlines 1.0 1.05]
        [--time-limit 120] [--effort 4]

The MILP: a binary per (instruction, Pareto-optimal option), exactly one per instruction;
start times with the DAG's precedence; every instruction done by the deadline; minimise the sum of
effective energies (energy - blocking power x time), to which blocking power x ranks x deadline
is added. With a time limit it reports its best plan (an upper bound on the optimum) and its
proven dual bound (a lower bound on the optimum, tighter than the convex relaxation's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_array

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from benchmarks.solver import GPUS, STAGES  # noqa: E402
from perseus.problem import EnergyProblem
from perseus.profiles import load_profile
from perseus.schedules import one_f_one_b
from perseus.solver import Relaxation, solve_problem


def milp_energy(
    problem: EnergyProblem, deadline: float, time_limit: float
) -> tuple[float, float, bool]:
    """Best plan energy the MILP finds within ``deadline``, its proven lower bound (the branch
    and bound's dual bound: no plan can do better) and whether the plan is proven optimal."""
    rel = Relaxation.build(problem)
    n, p, ranks = problem.num_nodes, problem.blocking_power, problem.dag.num_ranks
    eff = problem.energies - p * problem.times
    opts = [np.flatnonzero(rel.pareto[i]) for i in range(n)]
    cols = np.cumsum([0] + [len(o) for o in opts])
    nx = int(cols[-1])
    c = np.zeros(nx + n)
    for i, o in enumerate(opts):
        c[cols[i] : cols[i + 1]] = eff[i, o]
    ne = len(problem.dag.src)
    a = lil_array((2 * n + ne, nx + n))
    lo, hi = [], []
    for i in range(n):  # one option each
        a[i, cols[i] : cols[i + 1]] = 1
        lo.append(1)
        hi.append(1)
    for k, (u, v) in enumerate(zip(problem.dag.src, problem.dag.dst, strict=True)):
        a[n + k, nx + v] = 1  # start_v >= start_u + duration_u
        a[n + k, nx + u] = -1
        a[n + k, cols[u] : cols[u + 1]] = -problem.times[u, opts[u]]
        lo.append(0)
        hi.append(np.inf)
    for i, o in enumerate(opts):  # done by the deadline
        a[n + ne + i, nx + i] = 1
        a[n + ne + i, cols[i] : cols[i + 1]] = problem.times[i, o]
        lo.append(-np.inf)
        hi.append(deadline)
    res = milp(
        c,
        constraints=LinearConstraint(a.tocsr(), lo, hi),
        integrality=np.r_[np.ones(nx), np.zeros(n)],
        bounds=Bounds(np.zeros(nx + n), np.r_[np.ones(nx), np.full(n, deadline)]),
        options={"time_limit": time_limit, "mip_rel_gap": 1e-6},
    )
    dual = float(res.mip_dual_bound + p * ranks * deadline)
    if res.x is None:
        return float("nan"), dual, False
    return float(res.fun + p * ranks * deadline), dual, res.status == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gpu", choices=sorted(GPUS), default="a40")
    ap.add_argument("--microbatches", type=int, default=12)
    ap.add_argument("--deadlines", type=float, nargs="+", default=[1.0, 1.05])
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument(
        "--effort", type=float, default=0.0, help="also show Perseus with this search effort"
    )
    args = ap.parse_args(argv)
    path, power = GPUS[args.gpu]
    problem = EnergyProblem.build(load_profile(path), one_f_one_b(STAGES, args.microbatches), power)
    frontier = solve_problem(problem)
    harder = solve_problem(problem, effort=args.effort) if args.effort > 0 else None
    t0 = frontier.max_frequency_time
    print(f"{args.gpu.upper()} {STAGES}x{args.microbatches}: T0 = {t0:.4f} s")
    print(
        f"{'deadline':>11} {'bound':>11} {'Perseus':>11} {'MILP':>11} {'Perseus/bound':>14} "
        + (f"{f'effort {args.effort:g}/bound':>16} " if harder else "")
        + f"{'MILP/bound':>11} {'MILP proven/bound':>18}"
    )
    for f in args.deadlines:
        d = f * t0
        t = time.perf_counter()
        e_milp, dual, optimal = milp_energy(problem, d, args.time_limit)
        lb, ours = frontier.lower_bound_at(d), frontier.energy_at(d)
        more = f"{100 * (harder.energy_at(d) / lb - 1):>15.2f}% " if harder else ""
        print(
            f"{f:>9.4f}T0 {lb:>11.1f} {ours:>11.1f} {e_milp:>11.1f} {100 * (ours / lb - 1):>13.2f}% "
            f"{more}{100 * (e_milp / lb - 1):>10.2f}% {100 * (dual / lb - 1):>17.2f}%  "
            f"({'optimal' if optimal else 'best found'} in {time.perf_counter() - t:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
