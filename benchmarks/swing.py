"""Power swing: a plan and floors chosen together against floor-only references.

For each configuration (the shipped GPT-3 175B profiles, 8 stages, 1F1B, 12/24/48
microbatches; blocking power from ``perseus_common.gpus``), at a slowdown (default 0: T0) and
the bounds (default swing <= 0.30, every 100 ms change <= 12 % of the peak), this prints the
power timeline of all max clocks and of Perseus's plan (peak, trough, swing, largest change in
100 ms), then the energy per iteration (one pipeline, floors included) of

* uniform: the plan with the least floor held by every GPU all iteration that meets both bounds;
* trough: the plan with its power filled up to ``(1 - max_swing) * peak`` exactly where it
  falls below, the ramp bound ignored (so not a solution; a reference below any floor-only one);
* Perseus: :func:`perseus.power.plan_for_swing` (plan and floors chosen together);

the share of the uniform floor's extra energy Perseus saves, and the time of the plain
frontier solve and of the swing search, measured side by side in one run (the search is given
the plain solve's time as its budget, so solving with the bounds costs at most about 2x).

    python benchmarks/swing.py                       # A100 and A40 x 12, 24, 48
    python benchmarks/swing.py --gpu a100 --microbatches 12
    python benchmarks/swing.py --smoke               # A100 8 x 4 (the suite's)
    python benchmarks/swing.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from perseus.power import (
    SwingBounds,
    least_floors,
    plan_for_swing,
    trough_fill_energy,
    uniform_floor,
)
from perseus.power_timeline import rank_power
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


def _blocking(gpu: str) -> float:
    known = known_gpu_for(gpu)
    assert known is not None and known.blocking_power is not None, gpu
    return float(known.blocking_power)


def _shape(tl: Any) -> dict[str, float]:
    return {
        "peak": tl.peak,
        "trough": tl.trough,
        "swing": tl.swing,
        "change_100ms": tl.max_change(0.1),
        "band_share": tl.band_share(),
    }


def run_one(gpu: str, mb: int, bounds: SwingBounds, slowdown: float) -> dict[str, Any]:
    """Solve, search and measure one configuration."""
    problem = EnergyProblem.build(load_profile(PROFILES[gpu]), one_f_one_b(8, mb), _blocking(gpu))
    t = time.perf_counter()
    frontier = solve_problem(problem)
    solve_s = time.perf_counter() - t
    deadline = frontier.max_frequency_time * (1 + slowdown)
    plain = frontier.plans[frontier.index_for_deadline(deadline)]
    rp = rank_power(problem, plain)
    energy = rp.total().energy
    _, uniform_j = uniform_floor(rp, bounds)
    trough_j = trough_fill_energy(rp, bounds.max_swing or 0.0)
    plain_floors = least_floors(rp, bounds, resolution=bounds.window / 20)
    t = time.perf_counter()
    swing = plan_for_swing(
        frontier, problem, bounds, deadline, time_budget=0.9 * solve_s, max_evaluations=10**6
    )
    swing_s = time.perf_counter() - t
    after = swing.timeline
    uniform_total = energy + uniform_j
    return {
        "gpu": gpu,
        "microbatches": mb,
        "max_clocks": _shape(rank_power(problem, problem.max_frequency_plan()).total()),
        "plan": _shape(rp.total()),
        "after": _shape(after),
        "plan_energy": energy,
        "uniform_energy": uniform_total,
        "trough_energy": energy + trough_j,
        "plan_floors_energy": energy + plain_floors.energy,
        "perseus_energy": swing.energy,
        "perseus_time": swing.time,
        "deadline": deadline,
        "saved_share": (uniform_total - swing.energy) / (uniform_total - energy)
        if uniform_total > energy
        else 0.0,
        "meets": after.swing <= (bounds.max_swing or 1) + 1e-6
        and after.max_change(bounds.window) <= (bounds.max_ramp or 1) * after.peak * (1 + 1e-6),
        "floor_intervals": sum(len(r) for r in swing.floors.ranks),
        "evaluations": swing.evaluations,
        "solve_s": solve_s,
        "swing_s": swing_s,
    }


def _print(r: dict[str, Any]) -> None:
    print(f"\n{r['gpu'].upper()} 8 x {r['microbatches']}")
    print(f"  {'':18s} {'peak W':>8s} {'trough W':>9s} {'swing':>6s} {'100 ms W':>9s} {'band':>6s}")
    for name in ("max_clocks", "plan", "after"):
        s = r[name]
        print(
            f"  {name:18s} {s['peak']:8.0f} {s['trough']:9.0f} {s['swing']:6.3f}"
            f" {s['change_100ms']:9.0f} {s['band_share']:6.3f}"
        )
    print(f"  energy per iteration (J): plan alone {r['plan_energy']:.0f}")
    print(f"    uniform floor        {r['uniform_energy']:9.0f}")
    print(f"    trough fill (no ramp){r['trough_energy']:9.0f}")
    print(f"    plan + least floors  {r['plan_floors_energy']:9.0f}")
    print(f"    Perseus (together)   {r['perseus_energy']:9.0f}  meets bounds: {r['meets']}")
    below = r["perseus_energy"] < min(r["uniform_energy"], r["trough_energy"])
    print(f"  below both references: {below}")
    print(f"  share of the uniform floor's extra energy saved: {100 * r['saved_share']:.1f} %")
    print(
        f"  plan time {r['perseus_time']:.4f} s (deadline {r['deadline']:.4f} s); "
        f"{r['floor_intervals']} floor intervals; {r['evaluations']} evaluations"
    )
    ratio = (r["solve_s"] + r["swing_s"]) / r["solve_s"]
    print(
        f"  solve {r['solve_s']:.2f} s, swing search {r['swing_s']:.2f} s: "
        f"with the bounds {ratio:.2f}x the plain solve"
    )


def main() -> None:
    """Parse the arguments and run every configuration asked for."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", choices=sorted(PROFILES), action="append")
    ap.add_argument("--microbatches", type=int, action="append")
    ap.add_argument("--slowdown", type=float, default=0.0)
    ap.add_argument("--max-swing", type=float, default=0.30)
    ap.add_argument("--max-ramp", type=float, default=0.12)
    ap.add_argument("--window", type=float, default=0.1)
    ap.add_argument("--smoke", action="store_true", help="A100 8 x 4 only")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()
    gpus = ["a100"] if a.smoke else a.gpu or ["a100", "a40"]
    mbs = [4] if a.smoke else a.microbatches or [12, 24, 48]
    bounds = SwingBounds(a.max_swing, a.max_ramp, a.window)
    results = []
    for gpu in gpus:
        for mb in mbs:
            r = run_one(gpu, mb, bounds, a.slowdown)
            _print(r)
            results.append(r)
    if a.json:
        a.json.write_text(json.dumps({"bounds": bounds.to_json(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
