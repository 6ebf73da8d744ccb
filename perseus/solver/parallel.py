"""The relaxed sweep on several cores.

Deadline ranges are swept by worker processes and merged into one frontier of breakpoints.

The time range ``[t_min, t_max]`` is cut at deadlines ``T_1 > ... > T_{W-1}``, closer together
towards ``t_min`` where breakpoints crowd (``t_min + (t_max - t_min) (r / W)^2``). Worker 0 sweeps
from the longest durations down to ``T_1`` as the one-core sweep does; worker ``r >= 1`` first
solves its upper end ``T_r`` exactly as the LP's dual (the sandwich's
:class:`~perseus.solver.sandwich.Circulation`, in picoseconds), takes the durations its
potentials give (snapped to the hull vertex within 2 units, the longest path their time
``T'_r``), and sweeps from them down to ``T_{r+1}`` (``t_min``). The Phillips-Dessouky step needs an
optimal start, critical paths exact to its tolerance: nanosecond potentials were not (a range
drifted to 1e-3 above the one-core sweep), picosecond ones are (measured 1e-11).

Merged: worker ``r``'s breakpoints above ``T'_{r+1}``, then worker ``r + 1``'s. ``G`` is linear
between worker ``r``'s last breakpoint above ``T'_{r+1}`` and its next (at or below it), so no
breakpoint is missing. Certification: a range's values are those of feasible durations (upper
values of ``G``), exact up to the start's error; each worker ``r >= 1`` measures that error at
both ends against the circulation's certified tangent lines (its own at ``T'_r``, the next
worker's at the end; the fastest range's end is solved too), and the range's costs are lowered
by four times the larger (at least ``1e-12`` of the energy), so every merged value lies below
``G``. A start that is off by more than ``1e-7`` of the energy is not used: that worker sweeps
from the longest durations instead (correct, slower).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.errors import SolverCancelled
from perseus.problem import EnergyProblem
from perseus.solver.breakpoints import RelaxedFrontier
from perseus.solver.relaxation import Relaxation, sweep_range

__all__ = ["RangeStats", "parallel_sweep", "default_workers", "PARALLEL_MIN_NODES"]

FloatArray = npt.NDArray[np.float64]

#: Below this many DAG nodes the sweep takes a second or less: one process does it.
PARALLEL_MIN_NODES = 4096
#: A range start further than this share of the energy from the exact optimum is not used.
START_TOLERANCE = 1e-7


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class RangeStats:
    """One worker's range and what it cost.

    Its upper and lower deadline, breakpoints, CPU s (start solve included), the start's error
    (J) and the margin its costs were lowered by (J).
    """

    t_hi: float
    t_lo: float
    breakpoints: int
    cpu: float
    start_error: float
    margin: float


@dataclass(frozen=True)
class _Result:
    times: FloatArray
    costs: FloatArray
    kept_times: FloatArray
    kept_durations: FloatArray
    cpu: float
    #: (time, certified lower value of G there) at the start and at the end (or None)
    start_line: tuple[float, float] | None
    end_line: tuple[float, float] | None


# The forked workers read the problem from here (set before the pool forks; not pickled).
_SHARED: dict[str, object] = {}


def _hull_value(h: Relaxation, d: FloatArray) -> float:
    """``sum_i c_i(d_i)`` on the hulls ``h``."""
    total = 0.0
    for i in range(len(d)):
        k = int(h.nv[i])
        total += float(np.interp(d[i], h.tau[i, :k], h.cost[i, :k]))
    return total


def _exact_start(
    problem: EnergyProblem, h: Relaxation, deadline: float
) -> tuple[FloatArray, float, float] | None:
    """Durations optimal at their own time, from the circulation at ``deadline``.

    Returns ``(durations, their time, certified lower value of G there)``; None if off by more
    than :data:`START_TOLERANCE`.
    """
    from perseus.solver.sandwich import Circulation, time_unit

    unit = time_unit(problem, h)
    if unit < 1e11:
        return None
    net = Circulation(problem, h, unit=unit)
    lagr, flow, d = net.solve(deadline)
    tau = np.where(np.isfinite(h.tau), h.tau, np.inf)
    j = np.argmin(np.abs(tau - d[:, None]), axis=1)
    near = tau[np.arange(len(d)), j]
    d = np.where(np.abs(near - d) <= 2.0 / unit, near, d)
    t = float(problem.dag.iteration_time(d))
    lower = lagr - flow * (t - deadline)
    value = _hull_value(h, d)
    energy = abs(value) + problem.blocking_power * problem.dag.num_ranks * t
    if value - lower > START_TOLERANCE * max(energy, 1.0):
        return None
    return d, t, lower


def _line_at(problem: EnergyProblem, h: Relaxation, deadline: float) -> tuple[float, float]:
    from perseus.solver.sandwich import Circulation, time_unit

    net = Circulation(problem, h, unit=time_unit(problem, h))
    lagr, _, _ = net.solve(deadline)
    return deadline, lagr


def _work(t_hi: float | None, t_lo: float, memory: int, check_end: bool) -> _Result:
    problem = _SHARED["problem"]
    h = _SHARED["hulls"]
    assert isinstance(problem, EnergyProblem) and isinstance(h, Relaxation)
    cpu = time.process_time()
    start = line = None
    if t_hi is not None:
        found = _exact_start(problem, h, t_hi)
        if found is not None:
            start, t_start, lower = found
            line = (t_start, lower)
    times, costs, kt, kd = sweep_range(problem, h, memory=memory, start=start, t_stop=t_lo)
    end = None
    if check_end and times[0] > float(problem.dag.iteration_time(h.shortest)) * (1 + 1e-9):
        end = _line_at(problem, h, float(times[0]))
    return _Result(times, costs, kt, kd, time.process_time() - cpu, line, end)


def parallel_sweep(
    problem: EnergyProblem,
    relaxation: Relaxation,
    *,
    workers: int,
    memory: int,
    cancel: Callable[[], bool] | None = None,
    progress: Callable[[float], None] | None = None,
    hulls: Relaxation | None = None,
    stats: list[RangeStats] | None = None,
) -> RelaxedFrontier:
    """:meth:`RelaxedFrontier.sweep` by ``workers`` processes (see the module's docstring).

    The one-core sweep itself when ``workers < 2`` or fork is not available. ``stats`` gets one
    :class:`RangeStats` per range.
    """
    h = relaxation if hulls is None else hulls
    if workers < 2 or "fork" not in mp.get_all_start_methods():
        return RelaxedFrontier.sweep(
            problem, relaxation, memory=memory, cancel=cancel, progress=progress, hulls=hulls
        )
    dag = problem.dag
    t_min = float(dag.iteration_time(h.shortest))
    t_max = float(dag.iteration_time(h.longest))
    cuts = [t_min + (t_max - t_min) * (r / workers) ** 2 for r in range(workers, -1, -1)]
    # cuts[0] = t_max, cuts[-1] = t_min; range r is [cuts[r + 1], cuts[r]]
    _SHARED.update(problem=problem, hulls=h)
    futures: list[Future[_Result]] = []
    try:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
            for r in range(workers):
                last = r == workers - 1
                futures.append(
                    pool.submit(
                        _work, None if r == 0 else cuts[r], cuts[r + 1],
                        memory // workers, last,
                    )
                )  # fmt: skip
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                if progress is not None:
                    progress(1.0 - len(pending) / workers)
                if cancel is not None and cancel():
                    for p in list(getattr(pool, "_processes", {}).values()):
                        p.terminate()  # stop the sweeps now, not at their end
                    raise SolverCancelled("frontier computation cancelled")
            results = [f.result() for f in futures]
    finally:
        _SHARED.clear()
    return _merge(problem, relaxation, results, stats)


def _merge(
    problem: EnergyProblem,
    relaxation: Relaxation,
    results: list[_Result],
    stats: list[RangeStats] | None,
) -> RelaxedFrontier:
    pr = problem.blocking_power * problem.dag.num_ranks
    times: list[FloatArray] = []
    costs: list[FloatArray] = []
    kept_t: list[FloatArray] = []
    kept_d: list[FloatArray] = []
    for r, res in enumerate(results):
        nxt = results[r + 1] if r + 1 < len(results) else None
        below = -np.inf if nxt is None else float(nxt.times[-1])  # the next range's start
        errors = [0.0]
        started = res.start_line is not None  # else swept from the longest durations: exact
        for line in (res.start_line, res.end_line if nxt is None else nxt.start_line):
            if line is not None and started:
                errors.append(float(np.interp(line[0], res.times, res.costs)) - line[1])
        top = float(res.times[-1])
        scale = abs(float(res.costs[-1])) + pr * top
        margin = 4.0 * max(max(errors), 1e-12 * scale) if started else 0.0
        keep = res.times > below
        times.append(res.times[keep])
        costs.append(res.costs[keep] - margin)
        kk = res.kept_times > below
        kept_t.append(res.kept_times[kk])
        kept_d.append(res.kept_durations[kk])
        if stats is not None:
            stats.append(
                RangeStats(top, float(res.times[0]), int(keep.sum()), res.cpu, max(errors), margin)
            )
    order = np.argsort(np.concatenate(times), kind="stable")
    korder = np.argsort(np.concatenate(kept_t), kind="stable")
    return RelaxedFrontier.from_arrays(
        problem,
        relaxation,
        np.concatenate(times)[order],
        np.concatenate(costs)[order],
        np.concatenate(kept_t)[korder],
        np.concatenate(kept_d)[korder],
    )
