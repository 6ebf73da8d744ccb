"""Power budgets: Perseus's fastest plan within a cap against what operators do today.

For each configuration (the shipped GPT-3 175B profiles, 8 stages, 1F1B, 12/24/48/96
microbatches; blocking power from ``perseus_common.gpus``) and each budget (a fraction of the
max-clock average power ``E0 / T0``), this prints the slowdown against T0 and the energy per
iteration against E0 of:

* Perseus: the fastest frontier point whose average power is within the budget
  (``perseus.power.plan_for_power_budget``);
* the relaxed bound: the least slowdown any plan can have within the budget (the least ``T``
  with ``bound(T) <= budget * T``), which certifies Perseus's choice;
* a uniform per-GPU power limit (each instruction at the highest clock whose power is within the
  limit, the limit bisected so the job's average power meets the budget);
* a uniform SM clock lock (every instruction at one clock, the highest that meets the budget).

Then several jobs with different profiles under one cluster budget: the GPU-time lost (sum of
GPUs x slowdown, as a share of all GPUs) and the largest slowdown of the ``throughput`` and
``fair`` allocations against splitting the budget in proportion to each job's max-clock power
and applying a uniform power limit per job (and, for reference, Perseus per job on that split).

    python benchmarks/power.py                        # everything
    python benchmarks/power.py --gpu a100 --microbatches 12 --no-cluster
    python benchmarks/power.py --smoke                # A100 x 4 microbatches (the suite's)
"""

from __future__ import annotations

import argparse
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from perseus.frontier import Frontier
from perseus.power import (
    PowerBudgetError,
    PowerJob,
    allocate_power,
    bound_time_for_power,
    plan_for_power_budget,
    uniform_clock_lock,
    uniform_power_limit,
)
from perseus.problem import EnergyProblem
from perseus.profiles import load_profile
from perseus.schedules import one_f_one_b
from perseus.solver import solve_problem
from perseus_common.gpus import known_gpu_for

ROOT = Path(__file__).resolve().parent.parent
PROFILES = {
    "a100": ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv",
    "a40": ROOT / "profiles" / "gpt3-175b_a40_8stage.csv",
}
FRACTIONS = (0.95, 0.90, 0.85, 0.80, 0.70)
#: The cluster: (name, gpu, microbatches, data-parallel pipelines, tensor-parallel degree).
CLUSTER = (
    ("a100-8x12", "a100", 12, 4, 8),
    ("a40-8x24", "a40", 24, 2, 8),
    ("a100-8x48", "a100", 48, 1, 8),
)
CLUSTER_FRACTIONS = (0.90, 0.85, 0.80, 0.75)


@dataclass(frozen=True)
class Config:
    gpu: str
    microbatches: int
    problem: EnergyProblem
    frontier: Frontier
    solve_s: float

    @property
    def name(self) -> str:
        return f"{self.gpu.upper()} 8×{self.microbatches}"

    @property
    def max_power(self) -> float:
        return self.frontier.max_frequency_energy / self.frontier.max_frequency_time


def solve(gpu: str, microbatches: int) -> Config:
    path = PROFILES[gpu]
    known = known_gpu_for(path.name)
    assert known is not None, path
    problem = EnergyProblem.build(
        load_profile(path), one_f_one_b(8, microbatches), known.blocking_power
    )
    t = time.perf_counter()
    frontier = solve_problem(problem)
    return Config(gpu, microbatches, problem, frontier, time.perf_counter() - t)


def pct(x: float) -> str:
    if math.isnan(x):
        return "—"
    return f"{100 * x:.2f}" if abs(x) >= 5e-5 else "0.00"


def job_rows(cfg: Config, fractions: tuple[float, ...]) -> list[list[str]]:
    f = cfg.frontier
    t0, e0 = f.max_frequency_time, f.max_frequency_energy
    rows = []
    for frac in fractions:
        w = frac * cfg.max_power
        try:
            p = plan_for_power_budget(f, w)
            ps, pe = p.slowdown, p.energy / e0 - 1
        except PowerBudgetError:
            ps = pe = math.nan
        bound = bound_time_for_power(f, w) / t0 - 1
        try:
            lim = uniform_power_limit(cfg.problem, w)
            ls, le, lset = lim.time / t0 - 1, lim.energy / e0 - 1, f"{lim.setting:.0f} W"
        except PowerBudgetError:
            ls = le = math.nan
            lset = "—"
        try:
            clk = uniform_clock_lock(cfg.problem, w)
            cs, ce, cset = clk.time / t0 - 1, clk.energy / e0 - 1, f"{clk.setting:.0f} MHz"
        except PowerBudgetError:
            cs = ce = math.nan
            cset = "—"
        goal = ps <= max(bound, 0.0) + 0.003 + 1e-12 and (
            ps <= 1e-12 or (ps < ls and ps < cs)
        )  # fmt: skip
        rows.append(
            [
                cfg.name, f"{100 * frac:.0f} %", f"{w:.0f}",
                pct(ps), pct(pe), pct(max(bound, 0.0)), pct(ps - max(bound, 0.0)),
                f"{pct(ls)} ({lset})", pct(le), f"{pct(cs)} ({cset})", pct(ce),
                "yes" if goal else "NO",
            ]
        )  # fmt: skip
    return rows


def cluster_rows(fractions: tuple[float, ...]) -> list[list[str]]:
    cfgs = {name: (solve(gpu, mb), p, d) for name, gpu, mb, p, d in CLUSTER}
    jobs = [
        PowerJob.from_frontier(name, c.frontier, pipelines=p, tensor_parallel=d)
        for name, (c, p, d) in cfgs.items()
    ]
    gpus = sum(j.gpus for j in jobs)
    full = sum(c.max_power * p * d for c, p, d in cfgs.values())
    rows = []
    for frac in fractions:
        w = frac * full
        cells = [f"{100 * frac:.0f} %", f"{w / 1000:.1f}"]
        for policy in ("throughput", "fair"):
            t = time.perf_counter()
            a = allocate_power(jobs, w, policy=policy)
            ms = 1000 * (time.perf_counter() - t)
            cells += [
                f"{100 * a.gpu_time_lost / gpus:.2f} / {100 * a.max_slowdown:.2f}",
                f"{ms:.0f}",
            ]
        # proportional split: each job gets the budget's share of its max-clock power
        lost_u, worst_u, lost_p, worst_p = 0.0, 0.0, 0.0, 0.0
        for j, (c, p, d) in zip(jobs, cfgs.values(), strict=True):
            share = w * c.max_power * p * d / full / (p * d)  # one pipeline's watts
            u = uniform_power_limit(c.problem, share)
            s_u = u.time / c.frontier.max_frequency_time - 1
            s_p = plan_for_power_budget(c.frontier, share).slowdown
            lost_u += j.gpus * s_u
            lost_p += j.gpus * s_p
            worst_u, worst_p = max(worst_u, s_u), max(worst_p, s_p)
        cells += [
            f"{100 * lost_u / gpus:.2f} / {100 * worst_u:.2f}",
            f"{100 * lost_p / gpus:.2f} / {100 * worst_p:.2f}",
        ]
        rows.append(cells)
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", choices=sorted(PROFILES), action="append")
    ap.add_argument("--microbatches", type=int, nargs="+", default=[12, 24, 48, 96])
    ap.add_argument("--no-cluster", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="A100, 4 microbatches, no cluster")
    args = ap.parse_args()
    if args.smoke:
        args.gpu, args.microbatches, args.no_cluster = ["a100"], [4], True
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"commit {commit or 'unknown'}\n")
    rows: list[list[str]] = []
    solves = []
    for gpu in args.gpu or ["a100", "a40"]:
        for mb in args.microbatches:
            cfg = solve(gpu, mb)
            solves.append(
                f"{cfg.name}: {len(cfg.frontier)} points in {cfg.solve_s:.1f} s; max-clock power "
                f"{cfg.max_power:.0f} W; zero-slowdown plan "
                f"{100 * cfg.frontier.energies[0] / cfg.frontier.times[0] / cfg.max_power:.1f} %"
            )
            rows += job_rows(cfg, FRACTIONS)
    print("\n".join(solves) + "\n")
    print(
        table(
            ["config", "budget", "W", "Perseus slowdown %", "Perseus ΔE %", "bound slowdown %",
             "Perseus − bound (pts)", "power limit slowdown %", "power limit ΔE %",
             "clock lock slowdown %", "clock lock ΔE %", "goal met"],
            rows,
        )
    )  # fmt: skip
    if not args.no_cluster:
        print()
        names = ", ".join(f"{n} ({p}×{d} wide pipelines)" for n, _, _, p, d in CLUSTER)
        print(f"cluster: {names}; cells are GPU-time lost % / largest slowdown %\n")
        print(
            table(
                ["budget", "kW", "throughput", "ms", "fair", "ms",
                 "proportional + uniform limit", "proportional + Perseus"],
                cluster_rows(CLUSTER_FRACTIONS),
            )
        )  # fmt: skip


if __name__ == "__main__":
    main()
