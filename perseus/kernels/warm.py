"""Compile the solver's kernels ahead of time: ``python -m perseus.kernels.warm``.

numba compiles a kernel on its first call and (``cache=True``) writes the result to disk, so
only the first process pays. Run at install or image build time (``scripts/setup`` does), or
when a service starts before it reports healthy, this makes that first process this one: it
solves a tiny problem that reaches every kernel with the argument types the solver uses, so
later processes load them all from the cache (:mod:`perseus.kernels.cache`).
"""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["warm", "kernel_stats", "main"]


def _tiny_problem():  # -> EnergyProblem
    import numpy as np

    from perseus.problem import EnergyProblem
    from perseus.profiles import InstructionProfile, Profile
    from perseus.schedules import one_f_one_b

    f = np.array([1400, 1300, 1200, 1100, 1000, 900], dtype=np.int64)
    x = f / f[0]
    entries = {}
    for s in range(3):
        for kind, mult in (("forward", 1.0), ("backward", 2.0)):
            t = mult * (1 + 0.1 * s) * (0.2 + 0.8 / x)
            # a bump above the hull at one clock, so that every kind of option occurs
            e = (60 + 240 * x**3) * t * (1 + 0.02 * (f == 1200))
            entries[(s, kind)] = InstructionProfile(f, t, e)
    return EnergyProblem.build(Profile(entries), one_f_one_b(3, 4), 50.0)


def warm() -> float:
    """Solve a tiny problem with every stage switched on; returns the seconds it took.

    Every stage on means every kernel runs. The time is the compile time on a cold cache, a
    fraction of a second on a warm one.
    """
    from perseus.solver import SolverOptions, solve_problem

    t = time.perf_counter()
    opts = SolverOptions(target_gap=0.0, hard_gap=0.0, effort=2.0, search_work=2000)
    solve_problem(_tiny_problem(), opts, on_first_plan=lambda _: None)
    # the other relaxation core (the network simplex)
    solve_problem(_tiny_problem(), SolverOptions(relaxation="sandwich", effort=0.0))
    return time.perf_counter() - t


def kernel_stats() -> dict[str, tuple[int, int]]:
    """``{kernel: (cache hits, cache misses)}`` in this process, for every compiled kernel."""
    import importlib

    out = {}
    for leaf in (
        "exchange",
        "flow",
        "longest_paths",
        "network_simplex",
        "relaxed",
        "rounding",
        "search",
    ):
        mod = importlib.import_module(f"perseus.kernels.{leaf}")
        for name in dir(mod):
            f = getattr(mod, name)
            stats = getattr(f, "stats", None)
            if stats is not None and getattr(f, "__module__", "") == mod.__name__:
                hits = sum(stats.cache_hits.values())
                misses = sum(stats.cache_misses.values())
                out[f"{mod.__name__.rsplit('.', 1)[-1]}.{name}"] = (hits, misses)
    return out


def main(argv: list[str] | None = None) -> int:
    """Compile (or load) every kernel and print the seconds it took.

    Returns the exit status: 1 with ``--check`` when any kernel had to compile, else 0.
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if any kernel had to compile")
    args = ap.parse_args(argv)
    seconds = warm()
    stats = kernel_stats()
    compiled = sorted(k for k, (_, miss) in stats.items() if miss)
    from numba.core import config

    where = getattr(config, "CACHE_DIR", "") or "beside the sources (__pycache__)"
    print(f"perseus kernels ready in {seconds:.1f} s: {len(stats)} kernels, "
          f"{len(compiled)} compiled now, cache {where}")  # fmt: skip
    if args.check and compiled:
        print("compiled: " + ", ".join(compiled), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
