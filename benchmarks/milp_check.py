"""How much of the gap to the lower bound is the bound's.

The exact discrete optimum at a deadline, from HiGHS's MILP solver, beside Perseus's plan and the
convex-relaxation bound.

    python benchmarks/milp_check.py [--gpu a40] [--microbatches 12] [--deadlines 1.0 1.05]
        [--time-limit 120] [--effort 4] [--search 50000] [--windows 2]
    python benchmarks/milp_check.py --per-clock gpt3-a40 --deadlines 1.02 1.05
    python benchmarks/milp_check.py --smoke    # seconds (tests/benchmarks/test_milp_check_smoke.py)

With ``--per-clock CASE`` the input is one of ``benchmarks/per_clock.py``'s: a per-clock
transfer's duration in the MILP is its producer's choice's (a sum over the producer's binaries),
its effective cost charged to the producer, and a producer keeps all its options.

The MILP: a binary per (instruction, Pareto-optimal option), exactly one per instruction;
start times with the DAG's precedence; every instruction done by the deadline; minimise the sum of
effective energies (energy - blocking power x time), to which blocking power x ranks x deadline
is added. Options that cannot fit are left out beforehand (exactly: an instruction is never
longer than its fastest duration plus its float with every instruction at its fastest), which
lets HiGHS find better plans sooner. With a time limit it reports its best plan (an upper bound
on the optimum) and its proven dual bound (a lower bound on the optimum, tighter than the convex
relaxation's). ``--search N`` also hands the MILP's plan to Perseus's large-neighbourhood search
for N trials (the best plan either finds). ``--time-limit 0`` skips the MILP.

``--windows R`` re-optimises Perseus's own plan exactly, a time window at a time: the
instructions that start within a window of 1.5 times the first stage's forward + backward (in the
plan's schedule) get the MILP above, every other instruction keeping its option. A path between
two of them cannot leave the window and come back (it would have to start later than the window
ends), so the others enter only as release times (what must finish before) and due times (what
must start after). Two passes of overlapping windows make a round; with ``--search N``, each round
ends with N search trials (4 seeds, the best kept). It shows how far plans built from Perseus's
own can get at one deadline, and at what price.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_array

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from benchmarks.per_clock import CASES, SMOKE, build_problem  # noqa: E402
from benchmarks.solver import GPUS, STAGES  # noqa: E402
from perseus.problem import EnergyProblem
from perseus.profiles import load_profile
from perseus.schedules import one_f_one_b
from perseus.solver import Relaxation, Rounder, SolverOptions, solve_problem


def _milp(
    problem: EnergyProblem,
    nodes: npt.NDArray[np.intp],
    opts: list[npt.NDArray[np.intp]],
    release: npt.NDArray[np.float64],
    due: npt.NDArray[np.float64],
    inner: list[tuple[int, int]],
    options: dict[str, float],
    links: dict[int, tuple[int, npt.NDArray[np.float64]]] | None = None,
) -> tuple[npt.NDArray[np.uint8] | None, Any]:
    """HiGHS's MILP over ``nodes`` (node ``v`` choosing one of ``opts[v]``).

    Each starts no earlier than its ``release`` and ends by its ``due`` time, ``inner`` (pairs
    of positions in ``nodes``) orders them, and the sum of effective energies is minimised.
    ``links`` maps a position in ``nodes`` (a per-clock transfer) to the position of its
    producer and the transfer's time at each of the producer's options: its duration is then the
    producer's choice's (the truth's model, exactly). Returns each node's option (``None`` if
    HiGHS found no plan) and HiGHS's result.
    """
    cc = problem.cost_charged()  # each transfer's effective cost charged to its producer
    eff = cc.energies - problem.blocking_power * cc.times
    links = links or {}
    k = len(nodes)
    cols = np.r_[0, np.cumsum([len(opts[v]) for v in nodes])]

    def duration(i: int) -> tuple[slice, npt.NDArray[np.float64]]:
        """The columns and coefficients of position ``i``'s duration."""
        if i in links:
            p, tt = links[i]
            return slice(cols[p], cols[p + 1]), tt[opts[nodes[p]]]
        return slice(cols[i], cols[i + 1]), problem.times[nodes[i], opts[nodes[i]]]

    nx = int(cols[-1])
    c = np.zeros(nx + k)
    a = lil_array((2 * k + len(inner), nx + k))
    lo: list[float] = []
    hi: list[float] = []
    for i, v in enumerate(nodes):
        c[cols[i] : cols[i + 1]] = eff[v, opts[v]]
        a[i, cols[i] : cols[i + 1]] = 1  # one option each
        lo.append(1)
        hi.append(1)
    for i in range(k):  # done by the due time
        a[k + i, nx + i] = 1
        at, coef = duration(i)
        a[k + i, at] = coef
        lo.append(-np.inf)
        hi.append(due[i])
    for r, (i, j) in enumerate(inner):  # start_j >= start_i + duration_i
        a[2 * k + r, nx + j] = 1
        a[2 * k + r, nx + i] = -1
        at, coef = duration(i)
        a[2 * k + r, at] = -coef
        lo.append(0)
        hi.append(np.inf)
    res = milp(
        c,
        constraints=LinearConstraint(a.tocsr(), lo, hi),
        integrality=np.r_[np.ones(nx), np.zeros(k)],
        bounds=Bounds(np.r_[np.zeros(nx), release], np.r_[np.ones(nx), due]),
        options=options,
    )
    if res.x is None:
        return None, res
    x = res.x[:nx]
    chosen = [opts[v][np.argmax(x[cols[i] : cols[i + 1]])] for i, v in enumerate(nodes)]
    return np.array(chosen, dtype=np.uint8), res


def milp_plan(
    problem: EnergyProblem, deadline: float, time_limit: float
) -> tuple[npt.NDArray[np.uint8] | None, float, bool]:
    """Best plan the MILP finds within ``deadline``, its proven lower bound, and whether optimal.

    The plan is option indices (``None`` if none in time); its proven lower bound on the energy
    (the branch and bound's dual bound: no plan can do better) and whether the plan is proven
    optimal.
    """
    rel = Relaxation.build(problem)
    n, dag = problem.num_nodes, problem.dag
    fastest = rel.shortest
    longest_fit = dag.latest_finish(fastest, deadline) - dag.earliest_start(fastest)
    # a per-clock transfer's producer keeps every option: one dominated on its own time and
    # cost may still have the shorter transfer
    useful = rel.pareto.copy()
    useful[problem.clocked_producers] = (
        np.arange(problem.times.shape[1])[None, :]
        < problem.num_options[problem.clocked_producers][:, None]
    )
    fits = useful & (problem.times <= longest_fit[:, None] * (1 + 1e-12))
    links = {
        int(v): (int(p), problem.clocked_times[j])
        for j, (v, p) in enumerate(
            zip(problem.clocked_transfers, problem.clocked_producers, strict=True)
        )
    }
    plan, res = _milp(
        problem,
        np.arange(n),
        [np.flatnonzero(fits[i]) for i in range(n)],
        np.zeros(n),
        np.full(n, deadline),
        list(zip(dag.src.tolist(), dag.dst.tolist(), strict=True)),
        {"time_limit": time_limit, "mip_rel_gap": 1e-6},
        links,
    )
    dual = float(res.mip_dual_bound + problem.blocking_power * dag.num_ranks * deadline)
    return plan, dual, plan is not None and res.status == 0


def window_milp(
    problem: EnergyProblem,
    opts: list[npt.NDArray[np.intp]],
    plan: npt.NDArray[np.uint8],
    window: npt.NDArray[np.bool_],
    deadline: float,
) -> npt.NDArray[np.uint8] | None:
    """``plan`` with the instructions in ``window`` given their best options within ``deadline``.

    The options are ``opts``; the others are fixed; ``None`` if HiGHS finds nothing.
    """
    n, dag = problem.num_nodes, problem.dag
    dur = problem.durations(plan)
    start = dag.earliest_start(dur)
    late_start = dag.latest_finish(dur, deadline) - dur
    nodes = np.flatnonzero(window)
    col = np.full(n, -1)
    col[nodes] = np.arange(len(nodes))
    release = np.zeros(len(nodes))
    due = np.full(len(nodes), deadline)
    inner = []
    for u, v in zip(dag.src, dag.dst, strict=True):
        if col[v] >= 0 and col[u] < 0:
            release[col[v]] = max(release[col[v]], start[u] + dur[u])
        elif col[u] >= 0 and col[v] < 0:
            due[col[u]] = min(due[col[u]], late_start[v])
        elif col[u] >= 0:
            inner.append((int(col[u]), int(col[v])))
    chosen, _ = _milp(problem, nodes, opts, release, due, inner, {"time_limit": 60.0})
    if chosen is None:
        return None
    out = plan.copy()
    out[nodes] = chosen
    return out


def window_rounds(
    problem: EnergyProblem,
    plan: npt.NDArray[np.uint8],
    deadline: float,
    rounds: int,
    search: int,
    rounder: Rounder,
) -> npt.NDArray[np.uint8]:
    """``plan`` improved by ``rounds`` rounds of exact window re-optimisation.

    Each round is two passes (see the module docstring), followed by ``search`` search trials if
    any.
    """
    rel = Relaxation.build(problem)
    opts = [np.flatnonzero(rel.pareto[v]) for v in range(problem.num_nodes)]
    dag = problem.dag
    first = problem.times[dag.stage == 0].min(axis=1)
    width = 1.5 * 2 * float(np.median(first))
    best = energy_at(problem, plan, deadline)
    start = dag.earliest_start(problem.durations(plan))
    for _ in range(rounds):
        for offset in (0.0, width / 4):
            at = -offset
            while at < deadline:
                window = (start >= at) & (start < at + width)
                new = (
                    window_milp(problem, opts, plan, window, deadline) if window.sum() > 1 else None
                )
                # HiGHS's tolerances aside: never over the deadline, never worse
                e = np.inf if new is None else _fit_energy(problem, new, deadline)
                if new is not None and e < best - 1e-9 * abs(best):
                    plan, best = new, e
                    start = dag.earliest_start(problem.durations(plan))
                at += width / 2
        if search:
            runs = rounder.search(
                np.repeat(plan[None, :], 4, axis=0), np.full(4, deadline), np.arange(4), search
            )
            energies = [energy_at(problem, r, deadline) for r in runs]
            if min(energies) < best:
                plan, best = runs[int(np.argmin(energies))], min(energies)
                start = dag.earliest_start(problem.durations(plan))
    return plan


def _fit_energy(problem: EnergyProblem, plan: npt.NDArray[np.uint8], deadline: float) -> float:
    """Energy of ``plan`` over an iteration of ``deadline`` seconds (waiting included).

    Infinity if it does not fit.
    """
    t, e = problem.evaluate_many(plan[None, :])
    if t[0] > deadline * (1 + 1e-9):
        return float("inf")
    return float(e[0] + problem.blocking_power * problem.dag.num_ranks * (deadline - t[0]))


def energy_at(problem: EnergyProblem, plan: npt.NDArray[np.uint8] | None, deadline: float) -> float:
    """Energy of ``plan`` over an iteration of ``deadline`` seconds (waiting included)."""
    if plan is None:
        return float("nan")
    e = _fit_energy(problem, plan, deadline)
    assert np.isfinite(e), "a plan over its deadline"
    return e


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
    ap.add_argument(
        "--windows",
        type=int,
        default=0,
        help="also re-optimise Perseus's plan exactly by time windows, this many rounds",
    )
    ap.add_argument(
        "--per-clock",
        metavar="CASE",
        choices=[c.name for c in (*CASES, SMOKE)],
        help="instead: an input of benchmarks/per_clock.py (per-clock transfer times)",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="2 microbatches, one deadline, a 5 s MILP (a test)"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.microbatches, args.deadlines, args.time_limit = 2, [1.05], 5.0
    path, power = GPUS[args.gpu]
    problem = EnergyProblem.build(load_profile(path), one_f_one_b(STAGES, args.microbatches), power)
    if args.per_clock:
        problem = build_problem(next(c for c in (*CASES, SMOKE) if c.name == args.per_clock))
        if args.windows:
            ap.error("--windows: only without --per-clock (a window fixes producers' clocks)")
    frontier = solve_problem(problem)
    harder = solve_problem(problem, SolverOptions(effort=args.effort)) if args.effort > 0 else None
    rounder = Rounder(problem, Relaxation.build(problem))  # the solver's own search
    t0 = frontier.max_frequency_time
    name = args.per_clock or f"{args.gpu.upper()} {STAGES}x{args.microbatches}"
    print(f"{name}: T0 = {t0:.4f} s")
    print(
        f"{'deadline':>11} {'bound':>11} {'Perseus':>11} {'MILP':>11} {'Perseus/bound':>14} "
        + (f"{f'effort {args.effort:g}/bound':>16} " if harder else "")
        + f"{'MILP/bound':>11} "
        + (f"{'MILP+search/bound':>18} " if args.search else "")
        + (f"{'windows/bound':>14} " if args.windows else "")
        + f"{'MILP proven/bound':>18}"
    )
    for f in args.deadlines:
        d = f * t0
        t = time.perf_counter()
        if args.time_limit > 0:
            plan, dual, optimal = milp_plan(problem, d, args.time_limit)
        else:
            plan, dual, optimal = None, float("nan"), False
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
        if args.windows:
            t = time.perf_counter()
            own = frontier.plans[frontier.index_for_deadline(d, wait=True)]
            better = window_rounds(problem, own, d, args.windows, args.search, rounder)
            win_took = time.perf_counter() - t
            more_s += f"{100 * (energy_at(problem, better, d) / lb - 1):>13.2f}% "
        print(
            f"{f:>9.4f}T0 {lb:>11.1f} {ours:>11.1f} {e_milp:>11.1f} {100 * (ours / lb - 1):>13.2f}% "
            f"{more}{100 * (e_milp / lb - 1):>10.2f}% {more_s}{100 * (dual / lb - 1):>17.2f}%  "
            f"({'optimal' if optimal else 'best found'} in {took:.0f} s"
            + (f"; windows in {win_took:.0f} s)" if args.windows else ")"),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
