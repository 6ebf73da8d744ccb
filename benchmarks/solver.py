"""Perseus's frontier solver against lowtime (the Perseus authors' solver), side by side.

For each configuration (GPT-3 175B profiles on A100 SXM / A40, 8 stages, 1F1B, 12/24/48/96
microbatches) this runs both solvers in one process, one after the other, and prints a table:

* wall time of each solve and the ratio (Perseus: the median of ``PERSEUS_RUNS`` solves, its
  numba kernels loaded before timing; the one-off load/compile cost of a fresh process is
  printed separately; lowtime: one run);
* the fastest plan of each, truly re-evaluated from the measurements (lowtime's own estimate
  beside it), against all-max-frequency (T0, E0);
* energy saved against all max frequency at deadlines T0, 1.05 T0, 1.1 T0 and 1.2 T0 (a plan
  that finishes early pays blocking power until the deadline) and each one's gap to the
  certified lower bound (the convex-hull relaxation);
* the worst and the mean gap to the bound over 2,001 deadlines from T0 to 1.5 T0, and the share
  of them more than 0.3 % above it (the accuracy goal);
* the same gaps from one Perseus solve with more search effort (``--effort``, default 4).

lowtime is skipped where it would take over ``--lowtime-budget`` seconds (estimated from its
measured growth on this machine; see ``LOWTIME_MINUTES``). Peak RSS of a Perseus solve of the
largest configuration is measured in a child process.

    python benchmarks/solver.py                     # everything (lowtime takes ~15 min)
    python benchmarks/solver.py --no-lowtime        # Perseus only
    python benchmarks/solver.py --gpu a100 --microbatches 12
    python benchmarks/solver.py --smoke             # A100 x 4, Perseus only (the suite's)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import load_profile
from perseus.schedules import one_f_one_b
from perseus.solver import SolverOptions, solve_problem

ROOT = Path(__file__).resolve().parent.parent
GPUS = {
    "a100": (ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv", 83.64),
    "a40": (ROOT / "profiles" / "gpt3-175b_a40_8stage.csv", 70.38),
}
#: The Perseus paper's reported zero-slowdown savings (SOSP '24), for comparison.
PAPER_SAVING = {
    "a100": {12: 15.2, 24: 14.2, 48: 13.6, 96: 13.3},
    "a40": {12: 11.8, 24: 10.2, 48: 9.3, 96: 8.9},
}
#: lowtime's wall time on this 2-core machine, measured (12/24/48 on A100, 12 on A40) or
#: extrapolated from its iteration count and per-iteration growth (minutes).
LOWTIME_MINUTES = {
    ("a100", 12): 0.5,
    ("a100", 24): 1.1,
    ("a100", 48): 5.4,
    ("a100", 96): 28.0,
    ("a40", 12): 1.0,
    ("a40", 24): 3.0,
    ("a40", 48): 11.0,
    ("a40", 96): 60.0,
}
DEADLINES = (1.0, 1.05, 1.1, 1.2)
GOAL_GAP = 0.003  # the accuracy goal: within 0.3 % of the bound at every deadline
STAGES = 8


@dataclass
class Side:
    """What one solver produced, truly evaluated: plan times and energies."""

    wall: float
    times: np.ndarray
    energies: np.ndarray
    fastest_estimate: tuple[float, float] | None = None


def energy_at(side: Side, deadline: float, power: float, ranks: int) -> float:
    ok = side.times <= deadline * (1 + 1e-12)
    if not ok.any():
        return float("nan")
    return float((side.energies[ok] + power * ranks * (deadline - side.times[ok])).min())


#: Perseus solves per configuration; the median wall time is reported (a solve of well under a
#: second on a shared machine is at the mercy of its neighbours; lowtime's minutes-long runs
#: average that out, so it runs once). Solves are deterministic: every run gives the same
#: frontier.
PERSEUS_RUNS = 3


def run_perseus(problem: EnergyProblem) -> tuple[Side, Frontier]:
    walls = []
    for _ in range(PERSEUS_RUNS):
        t = time.perf_counter()
        frontier = solve_problem(problem)
        walls.append(time.perf_counter() - t)
    return Side(float(np.median(walls)), frontier.times, frontier.energies), frontier


def run_lowtime_side(gpu: str, microbatches: int) -> Side:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lowtime_runner import run_lowtime

    path, power = GPUS[gpu]
    res = run_lowtime(str(path), STAGES, microbatches, power)
    plans = np.stack([p.plan for p in res.plans])
    times, energies = res.problem.evaluate_many(plans)
    fastest = res.fastest
    return Side(res.wall_time, times, energies, (fastest.time, fastest.energy))


def pct(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:6.2f} %"


def report(
    gpu: str,
    m: int,
    frontier: Frontier,
    ours: Side,
    lt: Side | None,
    lt_note: str,
    harder: tuple[float, Side] | None = None,
) -> dict:
    power = frontier.blocking_power
    R = STAGES
    t0, e0 = frontier.max_frequency_time, frontier.max_frequency_energy
    rows: list[tuple[str, str, str, str]] = []

    def add(name: str, a: str, b: str = "", c: str = "") -> None:
        rows.append((name, a, b, c))

    out: dict = {"gpu": gpu, "microbatches": m, "T0": t0, "E0": e0, "perseus": {}, "lowtime": {}}
    add(f"solve wall time (Perseus: median of {PERSEUS_RUNS})", f"{ours.wall:.2f} s", f"{lt.wall:.1f} s" if lt else lt_note,
        f"{lt.wall / ours.wall:.0f}x faster" if lt else "")  # fmt: skip
    out["perseus"]["wall"] = ours.wall
    add("plans on the frontier", f"{len(ours.times)}", f"{len(lt.times)}" if lt else "")
    i_fast = int(np.argmin(ours.times))
    add(
        "fastest plan: true T vs T0",
        f"{100 * (ours.times[i_fast] / t0 - 1):+.3f} %",
        f"{100 * (lt.times.min() / t0 - 1):+.3f} %" if lt else "",
    )
    if lt and lt.fastest_estimate:
        add(
            "fastest plan: lowtime's own T estimate vs T0",
            "",
            f"{100 * (lt.fastest_estimate[0] / t0 - 1):+.3f} %",
        )
    paper = PAPER_SAVING[gpu].get(m)
    out["perseus"]["paper_saving_at_T0"] = paper
    for f in DEADLINES:
        D = f * t0
        base = e0 + power * R * (D - t0)
        lb = frontier.lower_bound_at(D)
        eo = energy_at(ours, D, power, R)
        el = energy_at(lt, D, power, R) if lt else float("nan")
        label = f"saving at {f:.2f} T0" + (f" (paper: {paper} %)" if f == 1.0 and paper else "")
        add(label, pct(100 * (1 - eo / base)), pct(100 * (1 - el / base)) if lt else "",
            "misses deadline" if lt and not np.isfinite(el) else "")  # fmt: skip
        add(
            f"  gap to lower bound at {f:.2f} T0",
            pct(100 * (eo / lb - 1)),
            pct(100 * (el / lb - 1)) if lt else "",
        )
        out["perseus"][f"saving@{f}"] = 100 * (1 - eo / base)
        out["perseus"][f"gap@{f}"] = 100 * (eo / lb - 1)
        if lt:
            out["lowtime"][f"saving@{f}"] = 100 * (1 - el / base)
            out["lowtime"][f"gap@{f}"] = 100 * (el / lb - 1)
    grid = np.linspace(t0, 1.5 * t0, 2001)
    lbs = np.array([frontier.lower_bound_at(D) for D in grid])
    g_ours = np.array([energy_at(ours, D, power, R) for D in grid]) / lbs - 1
    g_lt = np.array([energy_at(lt, D, power, R) for D in grid]) / lbs - 1 if lt else None
    add("worst gap, deadlines T0..1.5 T0", pct(100 * g_ours.max()),
        pct(100 * np.nanmax(g_lt)) if g_lt is not None else "")  # fmt: skip
    add("mean gap, deadlines T0..1.5 T0", pct(100 * g_ours.mean()), "")
    # lowtime has no plan for the deadlines below its fastest (nan): those count as above
    above = f"deadlines more than {100 * GOAL_GAP:g} % above the bound"
    add(above, pct(100 * np.mean(g_ours > GOAL_GAP)),
        pct(100 * np.mean(~(g_lt <= GOAL_GAP))) if g_lt is not None else "")  # fmt: skip
    out["perseus"]["worst_gap"] = 100 * g_ours.max()
    out["perseus"]["mean_gap"] = 100 * g_ours.mean()
    out["perseus"]["share_above_goal"] = 100 * np.mean(g_ours > GOAL_GAP)
    if harder:
        effort, side = harder
        g_h = np.array([energy_at(side, D, power, R) for D in grid]) / lbs - 1
        add(f"with --effort {effort:g} (one solve): wall time", f"{side.wall:.2f} s")
        add("  gap at T0 / worst gap T0..1.5 T0", f"{100 * g_h[0]:.2f} / {100 * g_h.max():.2f} %")
        add("  mean gap, deadlines T0..1.5 T0", pct(100 * g_h.mean()))
        add(f"  {above}", pct(100 * np.mean(g_h > GOAL_GAP)))
        out["perseus_effort"] = {
            "effort": effort,
            "wall": side.wall,
            "gap@1.0": 100 * g_h[0],
            "worst_gap": 100 * g_h.max(),
            "mean_gap": 100 * g_h.mean(),
            "share_above_goal": 100 * np.mean(g_h > GOAL_GAP),
        }
    if lt:
        out["lowtime"]["wall"] = lt.wall
        out["lowtime"]["fastest_vs_T0"] = 100 * (lt.times.min() / t0 - 1)

    title = f"{gpu.upper()}  {STAGES} stages x {m} microbatches  (T0 = {t0:.4f} s, E0 = {e0:.1f} J)"
    w = max(len(r[0]) for r in rows) + 2
    print("\n" + title)
    print("-" * len(title))
    print(f"{'':{w}}{'Perseus':>14}{'lowtime':>18}   ")
    for name, a, b, c in rows:
        print(f"{name:{w}}{a:>14}{b:>18}   {c}")
    return out


def peak_rss_child(gpu: str, m: int) -> float:
    """Peak RSS (MiB) of a fresh process that loads the profile and solves one configuration."""
    code = f"""
import resource, sys
sys.path.insert(0, {str(ROOT)!r})
from benchmarks.solver import GPUS, STAGES
from perseus.problem import EnergyProblem
from perseus.profiles import load_profile
from perseus.schedules import one_f_one_b
from perseus.solver import solve_problem
path, power = GPUS[{gpu!r}]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
solve_problem(EnergyProblem.build(load_profile(path), one_f_one_b(STAGES, {m}), power))
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = map(int, out.stdout.split())
    return after / 1024, before / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gpu", choices=sorted(GPUS), action="append")
    ap.add_argument("--microbatches", type=int, action="append")
    ap.add_argument("--no-lowtime", action="store_true")
    ap.add_argument(
        "--lowtime-budget",
        type=float,
        default=600.0,
        help="skip lowtime where it would take longer (s)",
    )
    ap.add_argument(
        "--effort",
        type=float,
        default=4.0,
        help="also solve once with this solver effort and report it (0: skip)",
    )
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument(
        "--smoke", action="store_true", help="A100 x 4 microbatches, no lowtime, effort 0"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.gpu, args.microbatches, args.no_lowtime, args.effort = ["a100"], [4], True, 0.0
    gpus = args.gpu or ["a100", "a40"]
    mbs = args.microbatches or [12, 24, 48, 96]

    t = time.perf_counter()
    p, w = GPUS[gpus[0]]
    solve_problem(EnergyProblem.build(load_profile(p), one_f_one_b(STAGES, 2), w))
    print(
        f"Perseus kernels loaded (numba cache) in {time.perf_counter() - t:.2f} s (once per process)"
    )

    results = []
    for gpu in gpus:
        path, power = GPUS[gpu]
        profile = load_profile(path)
        for m in mbs:
            problem = EnergyProblem.build(profile, one_f_one_b(STAGES, m), power)
            ours, frontier = run_perseus(problem)
            lt = None
            note = ""
            est = LOWTIME_MINUTES.get((gpu, m), float("inf")) * 60
            if args.no_lowtime:
                note = "not run"
            elif est > args.lowtime_budget:
                note = f"skipped (~{est / 60:.0f} min)"
            else:
                lt = run_lowtime_side(gpu, m)
            harder = None
            if args.effort > 0:
                t = time.perf_counter()
                fh = solve_problem(problem, SolverOptions(effort=args.effort))
                harder = (args.effort, Side(time.perf_counter() - t, fh.times, fh.energies))
            results.append(report(gpu, m, frontier, ours, lt, note, harder))
    big = max(
        ((g, m) for g in gpus for m in mbs), key=lambda gm: gm[1] * (2 if gm[0] == "a40" else 1)
    )
    rss, base = peak_rss_child(*big)
    print(f"\nPeak RSS of a fresh process solving {big[0].upper()} 8x{big[1]}: {rss:.0f} MiB "
          f"({base:.0f} MiB after imports, before the solve)")  # fmt: skip
    print(
        f"(max RSS of this benchmark process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "peak_rss_mib": rss}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
