"""Online profiling: the frontier of an online-measured profile against the true one.

For each job (the shipped GPT-3 175B profiles on A100 SXM and A40, sliced to their first 2-4
stages with ``Profile.select_stages``, 1F1B, one rank per stage) this drives
:class:`perseus_server.decisions.profiling_scan.ProfilingSession` offline, no server: at every clock of the
scan each rank runs its instructions on a noisy :class:`perseus_client.gpu.SimulatedGpu` that
follows the true profile (``noise`` relative standard deviation on every instruction's time and
energy), the iteration lasts the longest path through the pipeline of those noisy durations, and
each rank reports its instructions plus its iteration's time and energy (its instructions' energy
plus the blocking power, itself noisy, over the time it waited), exactly what the client sends.
Warm-up iterations are generated and discarded by the session like any other, and counted.

Two scans of the same job, side by side:

* **old**: the rule earlier versions stopped on (the job's energy per iteration rose
  ``stop_after_rises`` clocks in a row) with ``iterations_per_frequency`` measured iterations at
  every clock;
* **new**: the session's rule (every instruction's effective cost past its valley beyond the
  noise; repeats stop once the means are known within ``tolerance``).

From each measured profile the frontier is solved with the job's blocking power (the
``perseus_common.gpus`` value, as the server does). At T0, 1.05, 1.1 and 1.2 T0 the plan the
server would deploy (against the measured T0) is re-evaluated on the true profile
(``EnergyProblem.evaluate``) and its energy saving against all-max-clock over the same time
(a plan that finishes early waits at blocking power; T0/E0 of the true profile) is compared with
the true profile's frontier. Reported per job and rule: both savings, the largest difference in
points (goal: within 0.1), how late the plan truly runs, the largest shortfall against the true
frontier over the plan's own time (``loss@t``), the lowest clock measured, the iterations spent
and the blocking power measured. Time noise defaults to 0.5 % (instruction timings), energy
noise to 1.5 % (energy counters).

    python benchmarks/profiling.py                           # A100 and A40, 2/3/4 stages
    python benchmarks/profiling.py --gpu a40 --stages 2 --noise 0.015 --energy-noise 0.02
    python benchmarks/profiling.py --budgets 1 1.5 2 3 --seeds 1 2 3   # difference vs iterations
"""

from __future__ import annotations

import argparse
import functools
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# its sibling, whether this runs as a script or is imported as ``benchmarks.profiling``
sys.path.insert(0, str(Path(__file__).resolve().parent))
from profiling_transfers import TransferPool, measure  # noqa: E402

from perseus.frontier import Frontier
from perseus.problem import EnergyProblem
from perseus.profiles import Profile, load_profile, parse_profile_csv
from perseus.schedules import Schedule, one_f_one_b
from perseus.solver import solve_problem
from perseus_client.gpu import SimulatedGpu
from perseus_common.communication import Communication, Transfer
from perseus_common.gpus import known_gpu_for
from perseus_server.decisions.link_fit import (
    LinkFit,
    TransferSamples,
    clock_dependence,
    fit_transfers,
    with_measured_transfers,
)
from perseus_server.decisions.profiling_scan import (
    DEFAULT_MAX_REVISITS,
    Measurement,
    ProfilingSession,
)

ROOT = Path(__file__).resolve().parent.parent
PROFILES = {
    "a100": ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv",
    "a40": ROOT / "profiles" / "gpt3-175b_a40_8stage.csv",
}
DEADLINES = (1.0, 1.05, 1.1, 1.2)
GOAL_POINTS = 0.1
#: The issue's goal with transfers measured (points at T0, 1.05, 1.1, 1.2 T0).
GOAL_TRANSFER_POINTS = 0.2


@dataclass(frozen=True)
class Scan:
    """One online scan of a job and what it measured."""

    rule: str
    profile: Profile
    lowest_clock: int
    clocks: int
    iterations: int
    blocking_power: float | None


def simulate_scan(
    true: Profile,
    schedule: Schedule,
    blocking_power: float,
    session: ProfilingSession,
    *,
    noise: float,
    energy_noise: float,
    seed: int,
    old_rule: bool,
    transfers: list[dict[tuple[int, str], float]] | None = None,
) -> Scan:
    """Drive ``session`` with the reports of noisy simulated ranks until it says stop.

    For the old rule, the job's energy per iteration says stop. ``transfers``: measured link
    times per iteration (:mod:`profiling_transfers`), handed to the session with the iterations
    in the order they ran (from the start again if the scan needs more), one report per
    iteration carrying them as the server's link combiner does.
    """
    dag = EnergyProblem.build(true, schedule, blocking_power).dag
    ranks = [f"rank-{r}" for r in range(schedule.ranks)]
    nodes = [np.flatnonzero(dag.rank == r) for r in range(schedule.ranks)]
    gpus = [
        SimulatedGpu.from_profile(
            true,
            stage=r,
            blocking_power=blocking_power,
            time_scale=0,
            noise=noise,
            energy_noise=energy_noise,
            seed=seed * 1000 + r,
        )
        for r in range(schedule.ranks)
    ]
    rng = np.random.default_rng(seed)
    d = np.empty(dag.num_nodes)
    e = np.empty(dag.num_nodes)
    version = 0
    it = 0
    while True:
        version += 1
        session.step_version = version
        f = session.frequency
        for g in gpus:
            g.set_locked_clocks(f)
        while not session.step_complete(set(ranks), schedule.stages):
            for r, g in enumerate(gpus):
                for i in nodes[r]:
                    op = dag.ops[i]
                    t0, e0 = g.timestamp(), g.energy_mj()
                    g.begin_instruction(op.kind, op.microbatch, op.stage)
                    g.end_instruction()
                    d[i], e[i] = g.timestamp() - t0, (g.energy_mj() - e0) / 1000.0
            t_iter = float(dag.iteration_time(d))
            links = None
            if transfers:
                links = {
                    k: v
                    for k, v in transfers[it % len(transfers)].items()
                    if k[0] < true.stages - 1
                }
            it += 1
            for r, rank in enumerate(ranks):
                idx = nodes[r]
                idle = t_iter - float(d[idx].sum())
                p_wait = blocking_power * (1.0 + energy_noise * rng.standard_normal())
                ms = [
                    Measurement(dag.ops[i].kind, dag.ops[i].stage, f, float(d[i]), float(e[i]))
                    for i in idx
                ]
                session.record(
                    rank,
                    version,
                    float(e[idx].sum()) + p_wait * idle,
                    ms,
                    iteration_time=t_iter,
                    transfers=links if r == len(ranks) - 1 else None,
                )
        done = session.advance()
        if done or (old_rule and session.rises >= session.stop_after_rises):
            break
    measured = parse_profile_csv(session.profile_csv())
    return Scan(
        rule="old" if old_rule else "new",
        profile=measured,
        lowest_clock=min(measured.frequencies),
        clocks=len(session.energies),
        iterations=session.iterations_spent,
        blocking_power=session.measured_blocking_power,
    )


@dataclass(frozen=True)
class Savings:
    """One frontier's plans at each deadline factor, truly evaluated.

    ``points``: energy saved (%) against all max clock; ``best``: what the true frontier saves
    over the same iteration time; ``late``: how much later than the deadline the plan truly
    finishes (%); ``offset``: the plan's true time against its deadline (%, signed: negative
    when it finishes early and waits).
    """

    points: tuple[float, ...]
    best: tuple[float, ...]
    late: tuple[float, ...]
    offset: tuple[float, ...] = ()

    @property
    def loss(self) -> float:
        """The largest shortfall (points) against the true frontier at the same time."""
        return max(b - p for p, b in zip(self.points, self.best, strict=True))


def deployed_savings(
    frontier: Frontier, true_problem: EnergyProblem, true_frontier: Frontier
) -> Savings:
    """What the server would deploy at each of ``DEADLINES`` x T0, truly evaluated.

    At ``x``, the plan is ``frontier.index_for_deadline(x * T0', wait=True)`` with ``T0'`` the
    frontier's own all-max-clock time (for a measured frontier: the measured one). Its ops are
    mapped by clock onto the true profile's options (a measured profile's clocks are a subset;
    transfer and phase nodes have one option, whether the measured profile had them or not) and
    evaluated there: true time ``t`` and energy ``e``. The iteration lasts ``D = max(x T0, t)``
    (true ``T0``, ``E0``); the saving is ``1 - (e + P_b R (D - t)) / (E0 + P_b R (D - T0))``
    (the baseline: max clocks over the same time, waiting), and the true frontier's saving
    over the same ``D`` (``true_frontier.energy_at(D)``) is what it could have been.
    """
    pb, r = true_problem.blocking_power, true_problem.dag.num_ranks
    top = true_problem.evaluate(true_problem.max_frequency_plan())
    t0, e0 = top.time, top.energy
    n = true_problem.num_nodes
    points, best, late, offset = [], [], [], []
    for x in DEADLINES:
        k = frontier.index_for_deadline(x * frontier.max_frequency_time, wait=True)
        freqs = frontier.frequencies(k)
        plan = np.zeros(n, dtype=np.uint8)
        for i in range(true_problem.num_ops):
            row = true_problem.freqs[i, : true_problem.num_options[i]]
            plan[i] = int(np.flatnonzero(row == freqs[i])[0])
        ev = true_problem.evaluate(plan)
        span = max(x * t0, ev.time)
        base = e0 + pb * r * (span - t0)
        points.append(100 * (1 - (ev.energy + pb * r * (span - ev.time)) / base))
        best.append(100 * (1 - true_frontier.energy_at(span) / base))
        late.append(100 * max(0.0, ev.time / (x * t0) - 1))
        offset.append(100 * (ev.time / (x * t0) - 1))
    return Savings(tuple(points), tuple(best), tuple(late), tuple(offset))


@functools.cache
def _job(gpu: str, stages: int, microbatches: int) -> tuple[Profile, Schedule, float]:
    """A job's true compute profile, its schedule and the GPU's blocking power."""
    full = load_profile(PROFILES[gpu])
    known = known_gpu_for(PROFILES[gpu].name)
    assert known is not None
    return (
        full.select_stages(range(stages)),
        one_f_one_b(stages, microbatches),
        known.blocking_power,
    )


def _reference(
    true: Profile, schedule: Schedule, pb: float
) -> tuple[EnergyProblem, Frontier, Savings]:
    """The true problem, its frontier and the savings of its own plans."""
    true_problem = EnergyProblem.build(true, schedule, pb)
    true_frontier = solve_problem(true_problem)
    return true_problem, true_frontier, deployed_savings(true_frontier, true_problem, true_frontier)


def _truth(
    gpu: str, stages: int, microbatches: int
) -> tuple[Profile, Schedule, float, EnergyProblem, Frontier, Savings]:
    """A job's true profile, schedule, blocking power, problem, frontier and savings."""
    true, schedule, pb = _job(gpu, stages, microbatches)
    return true, schedule, pb, *_reference(true, schedule, pb)


def new_session(
    true: Profile,
    pb: float,
    old: bool,
    tolerance: float,
    budget: float = 1.0,
    cost_tolerance: float = 0.0,
) -> ProfilingSession:
    """The scan of a job by the old rule or the session's (see :func:`run_job`)."""
    return ProfilingSession(
        true.frequencies,
        warmup_iterations=2,
        iterations=math.ceil(5 * budget),
        stop_after_rises=3,
        blocking_power=pb,
        tolerance=0.0 if old else tolerance / math.sqrt(budget),
        noise_sigmas=math.inf if old else 3.0,
        smooth=not old,
        max_revisits=0 if old else DEFAULT_MAX_REVISITS,
        cost_tolerance=0.0 if old else cost_tolerance,
    )


def run_job(
    gpu: str,
    stages: int,
    microbatches: int,
    *,
    noise: float,
    energy_noise: float,
    seed: int,
    tolerance: float,
    rules: tuple[str, ...] = ("old", "new"),
    budget: float = 1.0,
    cost_tolerance: float = 0.0,
) -> tuple[str, Savings, dict[str, tuple[Scan, Savings]]]:
    """The scans of one job by each of ``rules``, and the true frontier's savings.

    ``budget`` scales the measuring: ``ceil(5 * budget)`` iterations at most per clock and the
    new rule's ``tolerance / sqrt(budget)`` (about ``budget`` times the samples per clock).
    ``cost_tolerance``: the new rule's plan-aware revisits of close effective costs (0: none).
    """
    true, schedule, pb, true_problem, true_frontier, ref = _truth(gpu, stages, microbatches)
    out: dict[str, tuple[Scan, Savings]] = {}
    for old in (r == "old" for r in rules):
        session = new_session(true, pb, old, tolerance, budget, cost_tolerance)
        scan = simulate_scan(
            true,
            schedule,
            pb,
            session,
            noise=noise,
            energy_noise=energy_noise,
            seed=seed,
            old_rule=old,
        )
        frontier = solve_problem(EnergyProblem.build(scan.profile, schedule, pb))
        out[scan.rule] = (scan, deployed_savings(frontier, true_problem, true_frontier))
    return f"{gpu.upper()} {stages}x{microbatches}", ref, out


VARIANTS = ("none", "fitted", "per clock")


@dataclass(frozen=True)
class TransferJob:
    """One job scanned with measured transfers: the plans of each variant of its profile.

    Variants: ``none`` (the measured profile without transfer rows), ``fitted`` (the server's
    :func:`fit_transfers`: one time per link unless the data shows a clock dependence) and
    ``per clock`` (the previous rule: each scanned clock's median, always).
    """

    job: str
    ref: Savings
    scan: Scan
    got: dict[str, Savings]
    truth_ms: dict[tuple[int, str], float]
    fits: dict[tuple[int, str], LinkFit]
    z: dict[tuple[int, str], float]
    per_clock_ms: dict[tuple[int, str], tuple[float, float]]


def _per_link(samples: TransferSamples) -> dict[tuple[int, str], dict[int, list[float]]]:
    by: dict[tuple[int, str], dict[int, list[float]]] = {}
    for (b, d, f), v in samples.samples.items():
        by.setdefault((b, d), {})[f] = v
    return by


def run_transfer_job(
    gpu: str,
    stages: int,
    microbatches: int,
    pool: TransferPool,
    *,
    noise: float,
    energy_noise: float,
    seed: int,
    tolerance: float,
) -> TransferJob:
    """Scan a job whose reports carry ``pool``'s measured link times (the session's rule).

    The truth: the job's compute profile with each link's median over the whole pool as its
    time (a gloo link does not depend on the SM clock: one time per link is the truth); each
    variant's plans are evaluated on it (:func:`deployed_savings`).
    """
    compute, schedule, pb = _job(gpu, stages, microbatches)
    links = [(b, d) for b in range(stages - 1) for d in ("forward", "backward")]
    truth_s = {k: pool.median(k) for k in links}
    true = compute.with_communication(Communication({k: Transfer(t) for k, t in truth_s.items()}))
    true_problem, true_frontier, ref = _reference(true, schedule, pb)
    session = new_session(compute, pb, False, tolerance)
    scan = simulate_scan(
        compute,
        schedule,
        pb,
        session,
        noise=noise,
        energy_noise=energy_noise,
        seed=seed,
        old_rule=False,
        transfers=pool.iterations,
    )
    fits = fit_transfers(session.transfers)
    per_link = _per_link(session.transfers)
    per_clock_fits = {}
    for link, per_clock in per_link.items():
        medians = {f: float(np.median(v)) for f, v in per_clock.items()}
        per_clock_fits[link] = LinkFit(medians[max(medians)], medians)
    profiles = {
        "none": scan.profile,
        "fitted": with_measured_transfers(scan.profile, fits),
        "per clock": with_measured_transfers(scan.profile, per_clock_fits),
    }
    got = {
        name: deployed_savings(
            solve_problem(EnergyProblem.build(p, schedule, pb)), true_problem, true_frontier
        )
        for name, p in profiles.items()
    }
    spread = {
        k: (min(f.times_by_clock.values()) * 1e3, max(f.times_by_clock.values()) * 1e3)
        for k, f in per_clock_fits.items()
        if f.times_by_clock
    }
    return TransferJob(
        f"{gpu.upper()} {stages}x{microbatches}",
        ref,
        scan,
        got,
        {k: 1e3 * t for k, t in truth_s.items()},
        fits,
        {k: clock_dependence(v) for k, v in per_link.items()},
        spread,
    )


def transfer_table(args: argparse.Namespace, gpus: list[str], stage_counts: list[int]) -> float:
    """Measure the transfer pool, scan every job with it and print each variant's savings.

    Returns the largest difference of the ``fitted`` variant (points).
    """
    pool = measure(
        max(stage_counts), args.pool, args.microbatches, width=args.width, busy=args.load
    )
    l0, l1 = pool.load_average
    print(
        f"transfers: {max(stage_counts)} gloo ranks in a chain, {len(pool.iterations)} measured "
        f"iterations of {args.microbatches} microbatches, 16 x {args.width} fp32; {args.load} "
        f"busy loop(s) beside them; 1-minute load average {l0:.1f} -> {l1:.1f}",
        flush=True,
    )
    print(
        f"{'job':<10} {'rows':<9} {'savings, measured profile':<29} "
        f"{'savings, true profile':<29} {'diff':>5} {'at T0':>5} {'late':>5} {'iters':>5}"
    )
    worst = {v: 0.0 for v in VARIANTS}
    for gpu in gpus:
        for k in stage_counts:
            res = run_transfer_job(
                gpu,
                k,
                args.microbatches,
                pool,
                noise=args.noise,
                energy_noise=args.energy_noise,
                seed=args.seed,
                tolerance=args.tolerance,
            )
            for v in VARIANTS:
                got = res.got[v]
                diff = max(abs(a - b) for a, b in zip(got.points, res.ref.points, strict=True))
                worst[v] = max(worst[v], diff)
                print(
                    f"{res.job:<10} {v:<9} {fmt_savings(got.points):<29} "
                    f"{fmt_savings(res.ref.points):<29} {diff:5.2f} "
                    f"{abs(got.points[0] - res.ref.points[0]):5.2f} {max(got.late):5.2f} "
                    f"{res.scan.iterations:>5}",
                    flush=True,
                )
            for link, fit in res.fits.items():
                lo, hi = res.per_clock_ms.get(link, (math.nan, math.nan))
                print(
                    f"  link {link[0]}/{link[1]:<8} truth {res.truth_ms[link]:.3f} ms; per-clock "
                    f"medians {lo:.3f}-{hi:.3f} ms; z {res.z[link]:.1f} -> "
                    + ("per clock" if fit.times_by_clock else f"one time {1e3 * fit.time:.3f} ms"),
                    flush=True,
                )
    for v in VARIANTS:
        print(f"rows {v}: largest diff {worst[v]:.3f} points (goal {GOAL_TRANSFER_POINTS})")
    return worst["fitted"]


def fmt_savings(points: tuple[float, ...]) -> str:
    return " / ".join(f"{x:5.2f}" for x in points)


def budget_table(
    gpus: list[str],
    stage_counts: list[int],
    microbatches: int,
    budgets: list[float],
    seeds: list[int],
    *,
    noise: float,
    energy_noise: float,
    tolerance: float,
    cost_tolerance: float = 0.0,
) -> None:
    """The new rule's difference against the true frontier, and its iterations, over ``seeds``.

    As the measuring budget scales (see :func:`run_job`).
    """
    print(
        f"new rule (cost tolerance {cost_tolerance:g}), budget scaling over seeds {seeds}: per "
        f"job the iterations spent (mean over seeds), the largest |points| difference over the "
        f"deadlines (max and mean over seeds; at T0: max), and the largest |offset| of a plan's "
        f"true time from its deadline (%, max over seeds and deadlines)"
    )
    print(
        f"{'budget':>6} {'job':<10} {'iters':>6} {'diff':>5} {'mean':>5} {'at T0':>5} "
        f"{'offset':>6}  per seed"
    )
    for b in budgets:
        every: list[float] = []
        worst_t0 = worst_offset = 0.0
        for gpu in gpus:
            for k in stage_counts:
                iters, diffs, at_t0, offsets = [], [], [], []
                for seed in seeds:
                    job, ref, res = run_job(
                        gpu,
                        k,
                        microbatches,
                        noise=noise,
                        energy_noise=energy_noise,
                        seed=seed,
                        tolerance=tolerance,
                        rules=("new",),
                        budget=b,
                        cost_tolerance=cost_tolerance,
                    )
                    scan, got = res["new"]
                    iters.append(scan.iterations)
                    diffs.append(
                        max(abs(x - y) for x, y in zip(got.points, ref.points, strict=True))
                    )
                    at_t0.append(abs(got.points[0] - ref.points[0]))
                    offsets.append(max(abs(o) for o in got.offset))
                every += diffs
                worst_t0 = max(worst_t0, *at_t0)
                worst_offset = max(worst_offset, *offsets)
                print(
                    f"{b:6.2g} {job:<10} {np.mean(iters):6.0f} {max(diffs):5.2f} "
                    f"{np.mean(diffs):5.2f} {max(at_t0):5.2f} {max(offsets):6.3f}  "
                    + " ".join(f"{d:.2f}" for d in diffs),
                    flush=True,
                )
        print(
            f"{b:6.2g} {'all':<10} {'':>6} {max(every):5.2f} {np.mean(every):5.2f} "
            f"{worst_t0:5.2f} {worst_offset:6.3f}",
            flush=True,
        )


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gpu", choices=sorted(PROFILES), action="append")
    ap.add_argument("--stages", type=int, action="append", help="2..4 (default: 2, 3, 4)")
    ap.add_argument("--microbatches", type=int, default=6)
    ap.add_argument("--noise", type=float, default=0.005, help="time's relative std-dev")
    ap.add_argument("--energy-noise", type=float, default=0.015, help="energy's relative std-dev")
    ap.add_argument("--tolerance", type=float, default=0.005, help="new rule's relative SE")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        help="instead: the new rule's difference against iterations as the measuring budget "
        "scales by these factors (over --seeds)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument(
        "--cost-tolerance",
        type=float,
        default=0.0,
        help="new rule: measure close effective costs again down to this relative error "
        "(0: off, the server's default)",
    )
    ap.add_argument(
        "--transfers",
        action="store_true",
        help="instead: the reports carry real gloo transfer times (a chain of torch ranks); "
        "the plans with no transfer rows, the fitted ones and per-clock ones",
    )
    ap.add_argument(
        "--load", type=int, default=0, help="busy loops beside the transfer-measuring ranks"
    )
    ap.add_argument("--pool", type=int, default=240, help="transfer iterations measured")
    ap.add_argument("--width", type=int, default=4096, help="activation width (16 rows, fp32)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the suite's: --transfers, A100 2 stages x 2 microbatches, 24 transfer iterations",
    )
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.smoke:
        args.transfers, args.gpu, args.stages, args.microbatches = True, ["a100"], [2], 2
        args.pool, args.width = 24, 256
    gpus = args.gpu or ["a100", "a40"]
    stage_counts = args.stages or [2, 3, 4]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    print(
        f"commit {commit}; noise: time {args.noise:.3g}, energy {args.energy_noise:.3g} "
        f"(relative std-dev); seed {args.seed}; 1F1B x{args.microbatches}; warm-up 2, at most 5 "
        f"iterations per clock, stop after 3; new rule's tolerance {args.tolerance:.3g}"
    )
    t_start = time.perf_counter()
    if args.transfers:
        transfer_table(args, gpus, stage_counts)
    elif args.budgets:
        budget_table(
            gpus,
            stage_counts,
            args.microbatches,
            args.budgets,
            args.seeds,
            noise=args.noise,
            energy_noise=args.energy_noise,
            tolerance=args.tolerance,
            cost_tolerance=args.cost_tolerance,
        )
    else:
        rule_table(args, gpus, stage_counts)
    print(f"wall time {time.perf_counter() - t_start:.1f} s")


def rule_table(args: argparse.Namespace, gpus: list[str], stage_counts: list[int]) -> None:
    """The old and the new rule's scans of every job, side by side (the default table)."""
    print(
        f"savings (%) at {' / '.join(f'{x:g}' for x in DEADLINES)} T0; diff: largest |points| "
        f"against the true frontier; late: largest % beyond the deadline; loss@t: largest "
        f"shortfall (points) against the true frontier over the plan's own time"
    )
    header = (
        f"{'job':<10} {'rule':<4} {'savings, measured profile':<29} "
        f"{'savings, true profile':<29} {'diff':>5} {'late':>5} {'loss@t':>6} {'lowest':>6} "
        f"{'clocks':>6} {'iters':>5} {'P_b meas.':>9}"
    )
    print(header)
    print("-" * len(header))
    worst = {"old": [0.0, 0.0, 0.0], "new": [0.0, 0.0, 0.0]}
    for gpu in gpus:
        for k in stage_counts:
            job, ref, res = run_job(
                gpu,
                k,
                args.microbatches,
                noise=args.noise,
                energy_noise=args.energy_noise,
                seed=args.seed,
                tolerance=args.tolerance,
                cost_tolerance=args.cost_tolerance,
            )
            for rule in ("old", "new"):
                scan, got = res[rule]
                diff = max(abs(a - b) for a, b in zip(got.points, ref.points, strict=True))
                row = (diff, max(got.late), got.loss)
                worst[rule] = [max(a, b) for a, b in zip(worst[rule], row, strict=True)]
                pbm = "-" if scan.blocking_power is None else f"{scan.blocking_power:.2f} W"
                print(
                    f"{job:<10} {rule:<4} {fmt_savings(got.points):<29} "
                    f"{fmt_savings(ref.points):<29} {row[0]:5.2f} {row[1]:5.2f} {row[2]:6.2f} "
                    f"{scan.lowest_clock:>6} {scan.clocks:>6} {scan.iterations:>5} {pbm:>9}"
                )
    for rule, (diff, late, loss) in worst.items():
        print(
            f"{rule} rule: largest diff {diff:.3f} points (goal {GOAL_POINTS}), late {late:.3f} %, "
            f"loss@t {loss:.3f} points"
        )


if __name__ == "__main__":
    main()
