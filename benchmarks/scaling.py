"""How the frontier solver's time and memory grow with the pipeline.

Deep pipelines, many microbatches, fine-grained clocks.

Inputs (built here, nothing to download):

* ``a100``: the shipped GPT-3 175B A100 SXM profile (8 stages) tiled across the stages: stage
  ``s`` gets the measurements of shipped stage ``s % 8``.
* ``smooth``: a synthetic DVFS profile with ``--clocks`` SM clocks (default 64) from 1980 MHz
  down in 15 MHz steps, every stage and kind from the same model (see :func:`smooth_profile`):
  time ``t(f) = t_mem + t_comp * fmax / f`` and power ``p(f) = p_static + p_dyn * (f / fmax)^k``
  (``k = 3``: voltage scales with frequency, dynamic power with ``f V^2``), energy ``p t``.
  Such a profile is smooth: (nearly) every clock is a vertex of its lower convex hull, the
  hardest case for the relaxation.

Configurations: 1F1B from 8 x 12 to 32 x 512 and interleaved 1F1B (V = 2, 4) up to the same
32,768 instructions. Each configuration is solved in its own child process (default solver
options), so its peak RSS is its own; the parent kills a child whose RSS passes
``--max-rss-gb`` or that runs past ``--timeout``. Per configuration it prints: instructions, hull
vertices per instruction, wall time until the verified zero-slowdown plan is known and of the
whole frontier, peak RSS, frontier points, the fastest plan's true time against T0, the worst gap
to the bound at T0, 1.02 T0 and 1.1 T0, and the log-log growth slope of time and peak RSS from the
previous size of the same family.

    python benchmarks/scaling.py                        # everything (tens of minutes)
    python benchmarks/scaling.py --quick                # up to 8,192 instructions
    python benchmarks/scaling.py --max-instructions 4096 --profile smooth
    python benchmarks/scaling.py --only 16x256 --profile smooth
    python benchmarks/scaling.py --only 16x128 --profile smooth --cprofile   # where time goes
    python benchmarks/scaling.py --relaxation sandwich --compare-sweep --quick
    python benchmarks/scaling.py --smoke                # one tiny input (a test runs it)
    python benchmarks/scaling.py --relax-only --relaxation sandwich --compare-sweep --only 16x128
    python benchmarks/scaling.py --only 32x512 --profile a100 --relaxation sweep --workers 1,2

``--relaxation`` picks the relaxation core (``SolverOptions.relaxation``); the stage columns are
the CPU seconds (all threads of the child) of the relaxation, the rounding (seed and refine),
the search and the polish, with the relaxation's wall time; the sandwich adds the deadlines it
solved and its network simplex pivots. ``--compare-sweep`` solves each input a second time with
the sweep (the old core), side by side: its whole-frontier wall time, relaxation CPU and gap at
T0 (``-`` where it did not finish within ``--timeout``). ``--workers 1,2`` solves each input with
``SolverOptions(workers=1)`` then ``2``, one row each: ``CPU`` is the user + sys time of the child
and its worker processes (from the solve's start), ``load`` the 1-minute load average when it
started, ``ranges CPU s`` each worker's CPU on its deadline range (start solve included; the
parallel sweep runs from ``perseus.solver.parallel.PARALLEL_MIN_NODES`` nodes), and peak RSS the
larger of the child's and its largest worker's. Because wall time on a shared machine is noise,
each row also says where the CPU went: per stage the two busiest threads' CPU s (the candidate
threads; threads that ended within a stage count as one), and ``crit``, the CPU on the
critical path (per stage its busiest thread, plus the busiest range worker in the relaxation,
or the stage's CPU over the cores where more threads than cores ran: the sweep beside the
rounding): what the whole frontier would take on idle cores, less the waits. From
``perseus.solver.pipeline.PIPELINE_MIN_NODES`` nodes the sweep runs beside the rounding: the
``relax`` columns then include the rounding of the windows it passed, and the ranges column
says ``sweep X``, the sweeping thread's own CPU s. To measure another source tree's solver
with this script (side by side), put that tree first on ``PYTHONPATH``. ``--transfers F`` adds
per-clock transfers (``F`` of the sender's forward, half scaling as ``fmax / f``), where the
planning and the bounding relaxations are two sweeps (on two threads with two cores).

The side-by-side one-vs-two-worker table (a few minutes on two idle cores)::

    python benchmarks/scaling.py --only 16x256x1 --profile a100 --relaxation sweep --workers 1,2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
A100 = (ROOT / "profiles" / "gpt3-175b_a100-sxm_8stage.csv", 83.64)
#: Blocking power (W) used with the synthetic profile.
SMOOTH_BLOCKING_POWER = 80.0
DEADLINES = (1.0, 1.02, 1.1)


@dataclass(frozen=True)
class Config:
    """One input: profile kind, ranks, microbatches, model chunks per rank."""

    profile: str
    stages: int
    microbatches: int
    virtual: int = 1

    @property
    def instructions(self) -> int:
        return 2 * self.stages * self.microbatches * self.virtual

    @property
    def family(self) -> str:
        return f"{self.profile} {'1f1b' if self.virtual == 1 else f'V={self.virtual}'}"

    @property
    def label(self) -> str:
        v = "" if self.virtual == 1 else f" V={self.virtual}"
        return f"{self.profile:6} {self.stages:2d} x {self.microbatches:3d}{v}"


#: 1F1B (stages, microbatches) and interleaved (stages, microbatches, V), by size.
ONE_F_ONE_B = [(8, 12), (8, 96), (16, 64), (16, 128), (16, 256), (32, 256), (32, 512)]
INTERLEAVED = [(16, 64, 2), (16, 128, 2), (16, 256, 2), (32, 256, 2), (16, 64, 4), (16, 128, 4),
               (16, 256, 4)]  # fmt: skip


def configs(profiles: list[str]) -> list[Config]:
    out = []
    for p in profiles:
        out += [Config(p, s, m) for s, m in ONE_F_ONE_B]
        out += [Config(p, s, m, v) for s, m, v in INTERLEAVED]
    return out


def tiled_profile(path: Path, stages: int):  # -> Profile
    """The profile at ``path`` repeated across ``stages`` stages.

    Stage ``s`` takes shipped stage ``s % shipped``.
    """
    from perseus.profiles import Profile, load_profile

    base = load_profile(path)
    return Profile({(s, k): base[(s % base.stages, k)] for s in range(stages) for k in base.kinds})


def smooth_profile(stages: int, clocks: int = 64, fmax: int = 1980, step: int = 15):  # -> Profile
    """A synthetic profile from a DVFS model, the same for every stage up to a small factor.

    The factor is deterministic, per stage (first and last stages heavier, as with
    embeddings/loss).

    ``t(f) = t_mem + t_comp * fmax / f``; ``p(f) = p_static + p_dyn * (f / fmax)^3``; energy
    ``p(f) t(f)``. Forward: ``t_comp = 40 ms``, ``t_mem = 8 ms``; backward twice that;
    ``p_static = 90 W``, ``p_dyn = 310 W``.
    """
    from perseus.profiles import InstructionProfile, Profile

    f = fmax - step * np.arange(clocks)
    x = f / fmax
    entries = {}
    for s in range(stages):
        w = 1.0 + (0.12 if s in (0, stages - 1) else 0.0) + 0.01 * ((s * 7) % 5)
        for kind, mult in (("forward", 1.0), ("backward", 2.0)):
            t = mult * w * (0.008 + 0.040 / x)
            p = 90.0 + 310.0 * x**3
            entries[(s, kind)] = InstructionProfile(f.astype(np.int64), t, p * t)
    return Profile(entries)


def build_problem(cfg: Config, transfers: float = 0.0):  # -> EnergyProblem
    """The problem of ``cfg``, with per-clock transfers when ``transfers > 0``.

    Every boundary's transfers then take that fraction of the sender's forward time, half of it
    scaling as ``fmax / f`` with the producer's clock (``benchmarks/communication.py``'s
    per-clock transfers).
    """
    from perseus.problem import EnergyProblem
    from perseus.schedules import interleaved_1f1b, one_f_one_b

    if cfg.profile == "a100":
        profile, power = tiled_profile(A100[0], cfg.stages), A100[1]
    elif cfg.profile == "smooth":
        profile, power = smooth_profile(cfg.stages), SMOOTH_BLOCKING_POWER
    else:
        raise ValueError(cfg.profile)
    if transfers > 0:
        from communication import with_transfers

        profile = with_transfers(profile, transfers, clocked=True)
    if cfg.virtual == 1:
        schedule = one_f_one_b(cfg.stages, cfg.microbatches)
    else:
        schedule = interleaved_1f1b(cfg.stages, cfg.microbatches, cfg.virtual)
    return EnergyProblem.build(profile, schedule, power)


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + sys) of each live thread of this process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def threaded_stats():  # -> SolveStats
    """A :class:`~perseus.solver.solve.SolveStats` that also records each thread's CPU per stage.

    ``threads`` maps a stage to the CPU seconds of every thread of this process that ran in it,
    largest first; the threads that ended within the stage (as the relaxation's second one
    does) count as one. The candidate threads end with the solve, so they are read at each
    stage's end.
    """
    from contextlib import contextmanager

    from perseus.solver.solve import SolveStats

    class ThreadedStats(SolveStats):
        threads: dict[str, list[float]]

        @contextmanager
        def stage(self, name: str):  # type: ignore[no-untyped-def]
            """The stage's wall and CPU time, and each thread's CPU in it."""
            before, cpu = thread_cpu(), time.process_time()
            with SolveStats.stage(self, name):
                yield
            after, cpu = thread_cpu(), time.process_time() - cpu
            used = [c - before.get(t, 0.0) for t, c in after.items()]
            used.append(cpu - sum(used))  # threads that ended in the stage, counted as one
            self.threads[name] = [round(c, 2) for c in sorted(used, reverse=True) if c >= 0.01]

    st = ThreadedStats()
    st.threads = {}
    return st


def critical_cpu(threads: dict[str, list[float]], ranges: list[float], cores: int = 1) -> float:
    """The CPU on the solve's critical path: the wall time on idle cores, less the waits.

    Per stage its busiest thread (in the relaxation, plus the busiest range worker process when
    the sweep ran over ranges), or the stage's CPU shared over ``cores`` when that is more
    (more threads than cores: the sweep beside the rounding), summed.
    """
    total = 0.0
    for name, used in threads.items():
        busiest = used[0] if used else 0.0
        if name == "relax" and ranges:
            busiest += max(ranges)
        total += max(busiest, sum(used) / max(cores, 1))
    return total


def child(
    cfg: Config,
    cprofile: bool = False,
    relaxation: str = "sweep",
    workers: int | None = 1,
    transfers: float = 0.0,
    effort: float = 1.0,
) -> dict:
    """Solve ``cfg`` in this process and measure it (``workers`` None: the default options').

    With ``cprofile``: under cProfile, the functions taking the most time printed to stderr.
    """
    import resource

    from perseus.solver import SolverOptions, solve_problem
    from perseus.solver.relaxation import Relaxation

    problem = build_problem(cfg, transfers)
    tiny = build_problem(Config(cfg.profile, 2, 2))
    solve_problem(tiny)  # kernels loaded (or compiled) before timing
    base_rss = _peak_rss_mib()
    hull = float(Relaxation.build(problem).nv.mean())
    first: list[float] = []
    load = os.getloadavg()[0]
    ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    t = time.perf_counter()
    stats = threaded_stats()
    kwargs = {
        "on_first_plan": lambda fr: first.append(time.perf_counter() - t),
        "options": SolverOptions(relaxation=relaxation, workers=workers, effort=effort),
        "stats": stats,
    }
    if cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        frontier = prof.runcall(solve_problem, problem, **kwargs)  # type: ignore[arg-type]
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(12)
    else:
        frontier = solve_problem(problem, **kwargs)  # type: ignore[arg-type]
    wall = time.perf_counter() - t
    ru2 = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(
        b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime for a, b in zip(ru, ru2, strict=True)
    )
    t0 = frontier.max_frequency_time
    out = {
        "instructions": problem.num_nodes,
        "hull": hull,
        "first": first[0] if first else None,
        "wall": wall,
        "rss": max(_peak_rss_mib(), ru2[1].ru_maxrss / 1024),
        "cpu": cpu,
        "load": load,
        "ranges": [r.cpu for r in stats.ranges],
        "base_rss": base_rss,
        "points": len(frontier),
        "bound_points": len(frontier.bound_times),
        "fastest": float(frontier.times[0] / t0 - 1),
        "relaxation": relaxation,
        "stages": stats.stages,
        "solves": stats.sandwich.solves if stats.sandwich else None,
        "pivots": stats.sandwich.pivots if stats.sandwich else None,
        "workers": workers,
        "transfers": transfers,
        "effort": effort,
        "threads": stats.threads,
        "critical": critical_cpu(
            stats.threads, [r.cpu for r in stats.ranges], len(os.sched_getaffinity(0))
        ),
        # the sweeping thread's own wall and CPU s when it ran beside the rounding
        "sweep_thread": None
        if getattr(stats, "sweep", None) is None
        else [stats.sweep.wall, stats.sweep.cpu],  # fmt: skip
    }
    for f in DEADLINES:
        # the sweep stops within 1e-9 (relative) of the fastest time, so the bound's first
        # breakpoint may lie that far past T0 (where lower_bound_at is inf)
        d = max(f * t0, float(frontier.bound_times[0]))
        out[f"gap@{f}"] = frontier.energy_at(d) / frontier.lower_bound_at(d) - 1
    return out


def relax_only(cfg: Config, relaxation: str, compare: bool) -> None:
    """The relaxation alone, in this process: CPU seconds, breakpoints or deadlines, and pivots.

    With ``compare`` the sweep too, and the worst relative distance of the two bounds over 2,000
    deadlines.
    """
    from perseus.solver.relaxation import Relaxation
    from perseus.solver.sandwich import SandwichStats
    from perseus.solver.stages import relax

    problem = build_problem(cfg)
    rel = Relaxation.build(problem)
    done = {}
    for core in [relaxation] + (["sweep"] if compare and relaxation != "sweep" else []):
        st = SandwichStats()
        c = time.process_time()
        rf = relax(problem, relaxation=rel, hull_tolerance=5e-4, core=core, stats=st)
        cpu = time.process_time() - c
        extra = f"{st.solves} solves, {st.pivots} pivots ({st.degenerate} degenerate)"
        what = extra if core == "sandwich" else f"{len(rf.times)} breakpoints"
        print(f"{cfg.label:20} {problem.num_nodes:6d} {core:8} {cpu:7.1f}s CPU  {what}", flush=True)
        done[core] = rf
    if len(done) == 2:
        a, b = done["sweep"].relaxed_bound, done[relaxation].relaxed_bound
        grid = np.linspace(done["sweep"].t_min, done["sweep"].t_max, 2000)
        ea, eb = a.bound(grid), b.bound(grid)
        print(f"{'':20} (sweep - {relaxation}) / sweep in [{((ea - eb) / ea).min():.1e}, "
              f"{((ea - eb) / ea).max():.1e}]")  # fmt: skip


def run_child(
    cfg: Config,
    timeout: float,
    max_rss_gb: float,
    cprofile: bool = False,
    relaxation: str = "sweep",
    workers: int | None = 1,
    transfers: float = 0.0,
    effort: float = 1.0,
) -> dict:
    """:func:`child` in a fresh process, killed past ``timeout`` s or ``max_rss_gb`` GB."""
    arg = json.dumps(
        [cfg.profile, cfg.stages, cfg.microbatches, cfg.virtual, relaxation, workers, transfers,
         effort]
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", arg] + (["--cprofile"] if cprofile else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    start = time.monotonic()
    why = None
    while proc.poll() is None:
        time.sleep(0.2)
        try:
            with open(f"/proc/{proc.pid}/status") as fh:
                rss = next(int(x.split()[1]) for x in fh if x.startswith("VmRSS"))
        except (OSError, StopIteration):
            rss = 0
        if rss > max_rss_gb * 1024**2:
            why = f"killed at {rss / 1024**2:.1f} GB"
        elif time.monotonic() - start > timeout:
            why = f"killed at {timeout:.0f} s"
        if why:
            proc.kill()
            proc.wait()
            return {"error": why}
    out, err = proc.communicate()
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}"}
    if cprofile:
        print(err, file=sys.stderr)
    return json.loads(out.strip().splitlines()[-1])


def _threads(threads: dict[str, list[float]]) -> str:
    """Each stage's two busiest threads' CPU s, e.g. ``round 6.2+5.8``."""
    short = {"first plan": "first", "relax": "relax", "round": "round", "search": "search",
             "polish": "polish"}  # fmt: skip
    return " ".join(
        f"{short.get(k, k)} {'+'.join(f'{c:.1f}' for c in v[:2]) or '0'}"
        for k, v in threads.items()
    )


def _ranges(r: dict) -> str:
    """The ranges' CPU s, or ``sweep X`` (the sweeping thread's CPU s beside the rounding)."""
    if r.get("sweep_thread"):
        return f"sweep {r['sweep_thread'][1]:.1f}"
    return " ".join(f"{c:.1f}" for c in r["ranges"]) or "-"


def _slope(prev: dict | None, cur: dict, key: str) -> str:
    if not prev or "error" in prev or "error" in cur or not prev.get(key) or not cur.get(key):
        return "   "
    s = math.log(cur[key] / prev[key]) / math.log(cur["instructions"] / prev["instructions"])
    return f"{s:4.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--profile", choices=["a100", "smooth"], action="append")
    ap.add_argument("--max-instructions", type=int, default=32768)
    ap.add_argument("--quick", action="store_true", help="up to 8,192 instructions")
    ap.add_argument(
        "--only",
        action="append",
        help="SxM or SxMxV, e.g. 16x256 or 16x256x4 (a size not in the table runs as given)",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="per configuration (s)")
    ap.add_argument("--max-rss-gb", type=float, default=6.0, help="kill a child past this")
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument(
        "--cprofile", action="store_true", help="profile each solve; top functions to stderr"
    )
    ap.add_argument("--relaxation", choices=["sweep", "sandwich", "auto"], default="auto")
    ap.add_argument("--compare-sweep", action="store_true", help="the sweep too, side by side")
    ap.add_argument("--smoke", action="store_true", help="one tiny input (A100 8 x 12), seconds")
    ap.add_argument("--relax-only", action="store_true", help="time the relaxation alone")
    ap.add_argument(
        "--workers",
        default="1",
        help="comma-separated SolverOptions.workers, each a row per input (e.g. 1,2; "
        "auto: None, the default: threads on every core, one sweep)",
    )
    ap.add_argument(
        "--transfers",
        type=float,
        default=0.0,
        help="per-clock transfers at this fraction of a forward (half scaling as fmax / f)",
    )
    ap.add_argument(
        "--effort",
        type=float,
        default=1.0,
        help="SolverOptions.effort (0: no searching; a quicker smoke of the other stages)",
    )
    args = ap.parse_args(argv)
    if args.child:
        p, s, m, v, rx, wk, tr, ef = json.loads(args.child)
        print(json.dumps(child(Config(p, s, m, v), args.cprofile, rx, wk, tr, ef)))
        return 0
    limit = min(args.max_instructions, 8192 if args.quick else 32768)
    profiles = args.profile or (["a100"] if args.smoke else ["smooth", "a100"])
    if args.smoke:
        limit = 192
    todo = [c for c in configs(profiles) if c.instructions <= limit]
    if args.only:
        want = {tuple(int(x) for x in o.split("x")) for o in args.only}
        todo = [c for c in todo if (c.stages, c.microbatches) in want
                or (c.stages, c.microbatches, c.virtual) in want]  # fmt: skip
        table = {(c.stages, c.microbatches) for c in configs(profiles)}
        table |= {(c.stages, c.microbatches, c.virtual) for c in configs(profiles)}
        # a size not in the table (a smaller smoke input, say) is run as asked
        todo += [Config(p, *w) for w in sorted(want - table) for p in profiles]
    if args.relax_only:
        for cfg in todo:
            relax_only(cfg, "sandwich" if args.relaxation == "sandwich" else "sweep",
                       args.compare_sweep)  # fmt: skip
        return 0
    head = (f"{'input':20} {'instr':>6} {'hull':>5} {'first':>7} {'whole':>7} {'RSS MiB':>8} "
            f"{'pts':>5} {'T/T0-1':>8} {'gap T0':>7} {'1.02':>6} {'1.1':>6} {'slope t':>7} "
            f"{'slope m':>7} | {'relax':>7} {'wall':>7} {'round':>6} {'search':>6} "
            f"{'polish':>6} {'solves':>6} {'pivots':>9} {'wk':>2} {'CPU':>7} {'crit':>7} "
            f"{'load':>5} ranges CPU s | busiest threads CPU s per stage")  # fmt: skip
    if args.compare_sweep:
        head += f" | {'sweep':>7} {'relax':>7} {'gap T0':>7}"
    print(f"relaxation: {args.relaxation}; stage columns: CPU s (relaxation also wall s)")
    print(head)
    print("-" * len(head))
    results = []
    prev: dict[str, dict] = {}
    runs = [(cfg, None if w == "auto" else int(w)) for cfg in todo for w in args.workers.split(",")]
    for cfg, wk in runs:
        r = run_child(
            cfg, args.timeout, args.max_rss_gb, args.cprofile, args.relaxation, wk, args.transfers,
            args.effort,
        )  # fmt: skip
        r["config"] = [cfg.profile, cfg.stages, cfg.microbatches, cfg.virtual]
        if args.compare_sweep:
            r["sweep"] = run_child(cfg, args.timeout, args.max_rss_gb, False, "sweep")
        results.append(r)
        if "error" in r:
            print(f"{cfg.label:20} {cfg.instructions:6d}  {r['error']}", flush=True)
        else:
            first = f"{r['first']:6.2f}s" if r["first"] is not None else "    n/a"
            rss = dict(r, rss=r["rss"])
            p = prev.get(f"{cfg.family} {wk}")
            st = r["stages"]
            line = (f"{cfg.label:20} {r['instructions']:6d} {r['hull']:5.1f} {first} "
                    f"{r['wall']:6.2f}s {r['rss']:8.0f} {r['points']:5d} {100 * r['fastest']:+7.3f}% "
                    f"{100 * r['gap@1.0']:6.2f}% {100 * r['gap@1.02']:5.2f}% "
                    f"{100 * r['gap@1.1']:5.2f}% {_slope(p, r, 'wall'):>7} "
                    f"{_slope(p, rss, 'rss'):>7} | {st['relax'][1]:6.1f}s {st['relax'][0]:6.1f}s "
                    f"{st['round'][1]:6.1f} {st['search'][1]:6.1f} {st['polish'][1]:6.1f} "
                    f"{r['solves'] if r['solves'] is not None else '-':>6} "
                    f"{r['pivots'] if r['pivots'] is not None else '-':>9} {r['workers'] or 'A':>2} "
                    f"{r['cpu']:6.1f}s {r['critical']:6.1f}s {r['load']:5.1f} "
                    f"{_ranges(r)} | "
                    f"{_threads(r['threads'])}")  # fmt: skip
            if args.compare_sweep:
                sw = r["sweep"]
                if "error" in sw:
                    line += f" | {'-':>7} {'-':>7} {'-':>7}"
                else:
                    line += (f" | {sw['wall']:6.1f}s {sw['stages']['relax'][1]:6.1f}s "
                             f"{100 * sw['gap@1.0']:6.2f}%")  # fmt: skip
            print(line, flush=True)
        prev[f"{cfg.family} {wk}"] = r
    print("\nslope: log-log growth from the previous size of the same family (time: whole "
          "frontier; memory: peak RSS)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
