"""What a plan computed without communication costs on a pipeline that communicates.

Against the plan computed with it.

Inputs (built here, nothing to download): the shipped GPT-3 175B profiles (A100 SXM and A40, 8
stages) and the A100 profile tiled over 16 stages (stage ``s`` takes shipped stage ``s % 8``);
every boundary's forward and backward transfer takes 1, 3 or 5 % of the sending stage's forward
time at its highest clock (at the blocking power, the same at every clock). Schedules: 1F1B (one
rank per stage) and interleaved 1F1B (two model stages per rank), ``2 x ranks`` microbatches.

For every row the *truth* is the profile with its transfers. Two frontiers are solved:

* *blind*: from the compute-only profile (what Perseus did before); its plans are run on the
  truth;
* *aware*: from the truth.

Columns: the true slowdown against the true T0 of each one's zero-slowdown plan (the blind plan
is late: its slack was the transfers'), the aware plan's gap to its certified bound at T0, and
the energy saved against running at the highest clocks (both iterations lasting the same time) at
the targets T0, 1.05 T0 and 1.1 T0. A blind plan aims at its own T0 (too small) times the target;
where it is late, the cell gives by how much, and the saving is counted over the longer
iteration it causes.

    python benchmarks/communication.py            # every row (minutes)
    python benchmarks/communication.py --smoke    # one small profile (seconds; a test runs it)
    python benchmarks/communication.py --clocked --stages 8   # per-clock transfer times

The run ends with ``OK`` when every row meets the goal (aware zero-slowdown plan on time, gap at
T0 within 0.5 %), else ``FAIL`` and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROFILES = {
    "a100": (ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv", 83.64),
    "a40": (ROOT / "profiles" / "gpt3-175b_a40_8stage.csv", 70.38),
}
TARGETS = (1.0, 1.05, 1.1)
FRACTIONS = (0.01, 0.03, 0.05)
GAP_GOAL = 0.005
#: Relative tolerance on "on time" (float rounding of a longest path).
ON_TIME = 1e-9


@dataclass(frozen=True)
class Row:
    profile: str
    schedule: str
    fraction: float
    nodes: int
    blind_late: tuple[float, ...]  # per target: true time / target - 1 (<= 0: on time)
    aware_late: float  # at T0
    gap: float  # aware, at T0
    blind_saved: tuple[float, ...]
    aware_saved: tuple[float, ...]
    seconds: float


def load(name: str, stages: int):  # -> (Profile, blocking power)
    from perseus.profiles import Profile, load_profile

    path, power = PROFILES[name]
    base = load_profile(path)
    if stages == base.stages:
        return base, power
    if stages < base.stages:
        return base.select_stages(range(stages)), power
    tiled = {(s, k): base[(s % base.stages, k)] for s in range(stages) for k in base.kinds}
    return Profile(tiled), power


def with_transfers(profile, fraction: float, *, clocked: bool = False):  # -> Profile
    """Every boundary's transfers at ``fraction`` of the sender's forward time at its highest clock.

    ``clocked``: half of that time scales as ``fmax / f`` with the producer's clock.
    """
    from perseus_common.communication import Communication, Transfer

    transfers = {}
    for b in range(profile.stages - 1):
        fwd = profile[(b, "forward")]
        t = fraction * float(fwd.times[0])
        by = None
        if clocked:
            fmax = int(fwd.frequencies[0])
            by = {int(f): t * (0.5 + 0.5 * fmax / int(f)) for f in fwd.frequencies}
        for d in ("forward", "backward"):
            transfers[(b, d)] = Transfer(t, None, by)
    return profile.with_communication(Communication(transfers, {}))


def run_row(
    profile_name: str, stages: int, schedule: str, fraction: float, *, clocked: bool = False
) -> Row:
    from perseus.problem import EnergyProblem
    from perseus.schedules import interleaved_1f1b, one_f_one_b
    from perseus.solver import solve_problem

    start = time.perf_counter()
    compute, power = load(profile_name, stages)
    truth_profile = with_transfers(compute, fraction, clocked=clocked)
    if schedule == "1f1b":
        sched = one_f_one_b(stages, 2 * stages)
    else:
        ranks = stages // 2
        sched = interleaved_1f1b(ranks, 2 * ranks, 2)
    truth = EnergyProblem.build(truth_profile, sched, power)
    blind_problem = EnergyProblem.build(compute, sched, power)
    blind = solve_problem(blind_problem)
    aware = solve_problem(truth)
    t0, e0 = (lambda r: (r.time, r.energy))(truth.evaluate(truth.max_frequency_plan()))
    wait = power * sched.ranks

    def saved(deadline: float, t: float, e: float) -> float:
        """Energy saved against the highest clocks, both lasting max(deadline, t)."""
        length = max(deadline, t)
        return 1.0 - (e + wait * (length - t)) / (e0 + wait * (length - t0))

    blind_late, blind_saved, aware_saved = [], [], []
    for x in TARGETS:
        i = blind.index_for_deadline(x * blind.max_frequency_time, wait=True)
        plan = np.zeros(truth.num_nodes, dtype=np.uint8)
        plan[: blind.plans.shape[1]] = blind.plans[i]
        r = truth.evaluate(plan)
        blind_late.append(r.time / (x * t0) - 1.0)
        blind_saved.append(saved(x * t0, r.time, r.energy))
        j = aware.index_for_deadline(x * t0, wait=True)
        aware_saved.append(saved(x * t0, float(aware.times[j]), float(aware.energies[j])))
    z = aware.index_for_slowdown(0.0)
    return Row(
        profile=f"{profile_name} x{stages}",
        schedule=schedule,
        fraction=fraction,
        nodes=truth.num_nodes,
        blind_late=tuple(blind_late),
        aware_late=float(aware.times[z]) / t0 - 1.0,
        gap=float(aware.energies[z]) / aware.lower_bound_at(t0) - 1.0,
        blind_saved=tuple(blind_saved),
        aware_saved=tuple(aware_saved),
        seconds=time.perf_counter() - start,
    )


def pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def late(x: float) -> str:
    return "on time" if x <= ON_TIME else f"+{100 * x:.2f} %"


def header() -> str:
    cols = [
        "profile",
        "schedule",
        "transfer",
        "nodes",
        "blind slowdown",
        "aware slowdown",
        "aware gap",
    ]
    cols += [f"saved {x:g} T0 blind / aware" for x in TARGETS]
    cols += ["s"]
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def line(r: Row) -> str:
    cells = [
        r.profile,
        r.schedule,
        f"{100 * r.fraction:g} %",
        str(r.nodes),
        late(r.blind_late[0]),
        late(r.aware_late),
        pct(r.gap),
    ]
    for k in range(len(TARGETS)):
        b = pct(r.blind_saved[k])
        if r.blind_late[k] > ON_TIME:
            b += f" (late {pct(r.blind_late[k])})"
        cells.append(f"{b} / {pct(r.aware_saved[k])}")
    cells.append(f"{r.seconds:.1f}")
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="one small profile, seconds")
    ap.add_argument(
        "--clocked",
        action="store_true",
        help="transfer times that depend on the producer's clock (half of each scales as "
        "fmax / f): what the solver models at the highest clock only",
    )
    ap.add_argument("--stages", type=int, choices=(8, 16), help="only the rows of this depth")
    args = ap.parse_args(argv)
    if args.smoke:
        rows = [("a100", 4, s, 0.03) for s in ("1f1b", "interleaved")]
    else:
        rows = [
            (p, n, s, f)
            for p, n in (("a100", 8), ("a40", 8), ("a100", 16))
            if args.stages in (None, n)
            for s in ("1f1b", "interleaved")
            for f in FRACTIONS
        ]
    print(header(), flush=True)
    ok = True
    for p, n, s, f in rows:
        r = run_row(p, n, s, f, clocked=args.clocked)
        print(line(r), flush=True)
        ok &= r.aware_late <= ON_TIME and -ON_TIME <= r.gap <= GAP_GOAL
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
