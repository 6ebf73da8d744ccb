"""How much of the gap to the lower bound is the bound's: the exact discrete optimum at a deadline,
from HiGHS's MILP solver, beside Perseus's plan and the convex-relaxation bound.

    python benchmarks/milp_check.py [--gpu a40] [--microbatches 12] [--deadlines 1.0 1.05]
        [--time-limit 120] [--effort 4] [--search 50000]

The MILP: a binary per (instruction, Pareto-optimal option), exactly one per instruction;
start times with the DAG's precedence; every instruction done by the deadline; minimise the sum of
effective energies (energy - blocking power x time), to which blocking power x ranks x deadline
is added. Options that cannot fit are left out beforehand (exactly: an instruction is never
longer than its fastest duration plus its float with every instruction at its fastest), which
lets HiGHS find better plans sooner. With a time limit it reports its best plan (an upper bound
on the optimum) and its proven dual bound (a lower bound on the optimum, tighter than the convex
relaxation's). ``--search N`` also hands the MILP's plan to Perseus's large-neighbourhood search
for N trials (the best plan either finds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_array

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from benchmarks.solver import GPUS, STAGES  # noqa: E402
from perseus.problem import EnergyProblem
from perseus.profiles import load_profile
from perseus.schedules import one_f_one_b
from perseus.solver import Relaxation, _Rounder, solve_problem


def milp_plan(
    problem: EnergyProblem, deadline: float, time_limit: float
) -> tuple[npt.NDArray[np.uint8] | None, float, bool]:
    """Best plan the MILP finds within ``deadline`` (option indices; ``None`` if none in time),
    its proven lower bound on the energy (the branch and bound's dual bound: no plan can do
    better) and whether the plan is proven optimal."""
    rel = Relaxation.build(problem)
    n, p, dag = problem.num_nodes, problem.blocking_power, problem.dag
    ranks = dag.num_ranks
    eff = problem.energies - p * problem.times
    fastest = rel.shortest
    longest_fit = dag.latest_finish(fastest, deadline) - dag.earliest_start(fastest)
    fits = rel.pareto & (problem.times <= longest_fit[:, None] * (1 + 1e-12))
    opts = [np.flatnonzero(fits[i]) for i in range(n)]
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
        return None, dual, False
    x = res.x[:nx]
    plan = np.array([o[np.argmax(x[cols[i] : cols[i + 1]])] for i, o in enumerate(opts)])
    return plan.astype(np.uint8), dual, res.status == 0


def energy_at(problem: EnergyProblem, plan: npt.NDArray[np.uint8] | None, deadline: float) -> float:
    """Energy of ``plan`` over an iteration of ``deadline`` seconds (waiting included)."""
    if plan is None:
        return float("nan")
    t, e = problem.evaluate_many(plan[None, :])
    assert t[0] <= deadline * (1 + 1e-9), "a plan over its deadline"
    return float(e[0] + problem.blocking_power * problem.dag.num_ranks * (deadline - t[0]))


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
    ap.add_argument(
        "--search",
        type=int,
        default=0,
        help="also hand the MILP's plan to Perseus's search for this many trials",
    )
    args = ap.parse_args(argv)
    path, power = GPUS[args.gpu]
    problem = EnergyProblem.build(load_profile(path), one_f_one_b(STAGES, args.microbatches), power)
    frontier = solve_problem(problem)
    harder = solve_problem(problem, effort=args.effort) if args.effort > 0 else None
    rounder = _Rounder(problem, Relaxation.build(problem))  # the solver's own search
    t0 = frontier.max_frequency_time
    print(f"{args.gpu.upper()} {STAGES}x{args.microbatches}: T0 = {t0:.4f} s")
    print(
        f"{'deadline':>11} {'bound':>11} {'Perseus':>11} {'MILP':>11} {'Perseus/bound':>14} "
        + (f"{f'effort {args.effort:g}/bound':>16} " if harder else "")
        + f"{'MILP/bound':>11} "
        + (f"{'MILP+search/bound':>18} " if args.search else "")
        + f"{'MILP proven/bound':>18}"
    )
    for f in args.deadlines:
        d = f * t0
        t = time.perf_counter()
        plan, dual, optimal = milp_plan(problem, d, args.time_limit)
        took = time.perf_counter() - t
        e_milp = energy_at(problem, plan, d)
        lb, ours = frontier.lower_bound_at(d), frontier.energy_at(d)
        more = f"{100 * (harder.energy_at(d) / lb - 1):>15.2f}% " if harder else ""
        if args.search:
            searched = None
            if plan is not None:
                searched = rounder.search(plan[None, :], np.array([d]), np.array([0]), args.search)
            e_s = min(e_milp, energy_at(problem, None if searched is None else searched[0], d))
            more_s = f"{100 * (e_s / lb - 1):>17.2f}% "
        else:
            more_s = ""
        print(
            f"{f:>9.4f}T0 {lb:>11.1f} {ours:>11.1f} {e_milp:>11.1f} {100 * (ours / lb - 1):>13.2f}% "
            f"{more}{100 * (e_milp / lb - 1):>10.2f}% {more_s}{100 * (dual / lb - 1):>17.2f}%  "
            f"({'optimal' if optimal else 'best found'} in {took:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
