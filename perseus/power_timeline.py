"""The power timeline of a plan: a job's power over one iteration, and how much it swings.

The model is the solver's own (:mod:`perseus.problem`): node ``i`` of the DAG (an instruction at
its chosen clock, a transfer, a phase) draws its energy ``e_i`` evenly over its duration
``d_i`` on its rank, from its earliest start (the longest path into it: ranks run their
instructions as soon as their inputs are there); a rank that runs nothing waits and draws the
blocking power ``P_b``. So rank ``r`` draws::

    p_r(t) = P_b + sum over its nodes running at t of (e_i / d_i - P_b)

and the integral of ``sum_r p_r`` over the iteration is exactly the plan's energy
``sum e_i + P_b (R T - sum d_i)``. Iterations run back to back, so the timeline is periodic
with the iteration time ``T`` as its period: the window that spans an iteration's end sees the
next one's start. A job of ``P`` pipelines ``d`` GPUs wide draws ``P * d`` times one
pipeline's power (the copies run in step).

Measures of a timeline ``p(t)`` (``docs/power.md``):

* ``peak = max p``, ``trough = min p``, ``swing = 1 - trough / peak``;
* the largest change within a window ``w`` (e.g. 100 ms): ``max |p(u) - p(v)|`` over
  ``|u - v| < w`` (periodically), what a utility's ramp-rate limit bounds;
* the share of the swing's spectrum in a band (default 0.1-20 Hz): ``p`` is periodic, so its
  spectrum is its Fourier series at ``k / T`` Hz; the share is the band's part of
  ``sum_{k >= 1} |c_k|^2`` (the variance, by Parseval). Coefficients of a piecewise-constant
  function are exact sums, so no sampling is involved.

Everything is exact on the piecewise-constant form (breakpoints at node starts and ends):
``O(m log m)`` for ``m`` breakpoints, plus ``O(m K)`` for ``K`` harmonics in the band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.problem import EnergyProblem

__all__ = [
    "DEFAULT_BAND",
    "DEFAULT_WINDOW",
    "PowerTimeline",
    "RankPower",
    "rank_power",
    "plan_timeline",
    "window_key",
]

FloatArray = npt.NDArray[np.float64]
PlanArray = npt.NDArray[np.uint8]

#: The window (s) of the largest change a timeline reports by default.
DEFAULT_WINDOW = 0.1
#: The band (Hz) of :meth:`PowerTimeline.band_share` by default.
DEFAULT_BAND = (0.1, 20.0)


def window_key(window: float) -> str:
    """The JSON key of a window: its seconds, shortest exact form (``0.1``, ``0.25``, ``1``)."""
    return f"{float(window):g}"


@dataclass(frozen=True)
class PowerTimeline:
    """A periodic piecewise-constant power ``watts[k]`` on ``[times[k], times[k + 1])``.

    Attributes:
        times: ``(m + 1,)`` increasing breakpoints, ``times[0] = 0``, ``times[-1]`` the period.
        watts: ``(m,)`` power on each piece (W).
    """

    times: FloatArray
    watts: FloatArray

    @property
    def period(self) -> float:
        """The iteration time (s): the timeline repeats with it."""
        return float(self.times[-1])

    @property
    def peak(self) -> float:
        """The highest power (W)."""
        return float(self.watts.max())

    @property
    def trough(self) -> float:
        """The lowest power (W)."""
        return float(self.watts.min())

    @property
    def swing(self) -> float:
        """``1 - trough / peak``: 0 for a flat timeline, 1 when it falls to nothing."""
        peak = self.peak
        return 1.0 - self.trough / peak if peak > 0 else 0.0

    @property
    def energy(self) -> float:
        """Joules over one period."""
        return float(np.dot(np.diff(self.times), self.watts))

    @property
    def average(self) -> float:
        """Average power (W) over one period."""
        return self.energy / self.period

    def at(self, t: float | FloatArray) -> FloatArray:
        """The power at time(s) ``t`` (periodic)."""
        tt = np.mod(np.asarray(t, dtype=np.float64), self.period)
        k = np.searchsorted(self.times, tt, side="right") - 1
        return np.asarray(self.watts[np.clip(k, 0, len(self.watts) - 1)], dtype=np.float64)

    def scaled(self, factor: float) -> PowerTimeline:
        """``factor`` copies in step (pipelines x tensor-parallel GPUs)."""
        return PowerTimeline(self.times, self.watts * float(factor))

    def max_change(self, window: float = DEFAULT_WINDOW) -> float:
        """The largest ``|p(u) - p(v)|`` over ``|u - v| < window`` (periodically), in W."""
        if not (window > 0 and math.isfinite(window)):
            raise ValueError(f"window must be a finite number of seconds > 0, got {window!r}")
        m = len(self.watts)
        if window >= self.period or m == 1:
            return self.peak - self.trough
        start = np.concatenate([self.times[:-1], self.times[:-1] + self.period])
        end = np.concatenate([self.times[1:], self.times[1:] + self.period])
        vals = np.concatenate([self.watts, self.watts])
        # Pieces i..j are all within one window when the gap start[j] - end[i] < window.
        last = np.searchsorted(start, end[:m] + window, side="left") - 1
        last = np.minimum(last, np.arange(m) + m - 1)
        hi, lo = _range_extremes(vals, np.arange(m), last)
        return float((hi - lo).max())

    def band_share(self, band: tuple[float, float] = DEFAULT_BAND) -> float:
        """The share of the variance (the swing's spectrum) at harmonics within ``band`` Hz."""
        low, high = float(band[0]), float(band[1])
        if not (0 <= low <= high):
            raise ValueError(f"band must be (low, high) Hz with 0 <= low <= high, got {band!r}")
        period = self.period
        dt = np.diff(self.times)
        mean = self.average
        variance = float(np.dot(dt, (self.watts - mean) ** 2)) / period
        k_lo, k_hi = max(1, math.ceil(low * period - 1e-9)), math.floor(high * period + 1e-9)
        if variance <= 1e-12 * max(mean, 1.0) ** 2 or k_hi < k_lo:
            return 0.0
        total = 0.0
        for chunk in range(k_lo, k_hi + 1, 256):
            k = np.arange(chunk, min(chunk + 256, k_hi + 1), dtype=np.float64)
            omega = 2 * np.pi * k[:, None] / period
            a, b = self.times[None, :-1], self.times[None, 1:]
            parts = (np.exp(-1j * omega * a) - np.exp(-1j * omega * b)) / (1j * omega)
            c = parts @ self.watts / period
            total += 2.0 * float(np.sum(np.abs(c) ** 2))
        return min(1.0, total / variance)

    def to_json(
        self,
        windows: Sequence[float] = (DEFAULT_WINDOW,),
        band: tuple[float, float] = DEFAULT_BAND,
    ) -> dict[str, Any]:
        """The plan documents' ``power_timeline``: the measures, not the samples."""
        return {
            "period_s": self.period,
            "peak_w": self.peak,
            "trough_w": self.trough,
            "swing": self.swing,
            "average_w": self.average,
            "max_change_w": {window_key(w): self.max_change(w) for w in windows},
            "band_hz": [float(band[0]), float(band[1])],
            "band_share": self.band_share(band),
        }

    def samples(self, iterations: int = 2) -> tuple[FloatArray, FloatArray]:
        """Step-plot points ``(t, W)`` over ``iterations`` periods (for plots)."""
        reps = np.arange(iterations, dtype=np.float64)[:, None] * self.period
        t = (self.times[None, :-1] + reps).ravel()
        w = np.tile(self.watts, iterations)
        return np.append(t, iterations * self.period), np.append(w, self.watts[0])


def _range_extremes(
    vals: FloatArray, first: npt.NDArray[np.int64], last: npt.NDArray[np.int64]
) -> tuple[FloatArray, FloatArray]:
    """Max and min of ``vals[first[i]..last[i]]`` (inclusive) for every ``i``: a sparse table."""
    n = len(vals)
    hi_t, lo_t = [vals], [vals]
    span = 1
    while 2 * span <= n:
        hi_t.append(np.maximum(hi_t[-1][:-span], hi_t[-1][span:]))
        lo_t.append(np.minimum(lo_t[-1][:-span], lo_t[-1][span:]))
        span *= 2
    length = last - first + 1
    level = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    hi = np.empty(len(first))
    lo = np.empty(len(first))
    for lv in np.unique(level):
        sel = level == lv
        a, b = first[sel], last[sel] - (1 << int(lv)) + 1
        hi[sel] = np.maximum(hi_t[lv][a], hi_t[lv][b])
        lo[sel] = np.minimum(lo_t[lv][a], lo_t[lv][b])
    return hi, lo


@dataclass(frozen=True)
class RankPower:
    """Every rank's power on common breakpoints, over one iteration of one pipeline.

    Attributes:
        times: ``(m + 1,)`` breakpoints from 0 to the iteration time.
        watts: ``(R, m)`` rank ``r``'s power on piece ``k``.
        blocking_power: what a waiting rank draws (W).
    """

    times: FloatArray
    watts: FloatArray
    blocking_power: float

    def total(self, copies: float = 1.0) -> PowerTimeline:
        """The pipeline's summed power, times ``copies`` (pipelines x tensor-parallel)."""
        return PowerTimeline(self.times, self.watts.sum(axis=0) * float(copies))


def _node_schedule(
    problem: EnergyProblem, plan: PlanArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Earliest start, true duration and true energy of every node under ``plan``."""
    from perseus.kernels.longest_paths import earliest_start

    idx = np.asarray(plan, dtype=np.int64)
    rows = np.arange(problem.num_nodes)
    d = (problem.times if problem.true_times is None else problem.true_times)[rows, idx].copy()
    e = (problem.energies if problem.true_energies is None else problem.true_energies)[
        rows, idx
    ].copy()
    if problem.clocked_transfers.size:
        v = problem.clocked_transfers
        tt = problem.clocked_times[np.arange(len(v)), idx[problem.clocked_producers]]
        d[v] = tt
        e[v] = problem.clocked_power * tt
    dag = problem.dag
    es = earliest_start(dag.topo, dag.pred_ptr, dag.pred_idx, np.ascontiguousarray(d))
    return np.asarray(es), d, e


def rank_power(problem: EnergyProblem, plan: PlanArray) -> RankPower:
    """Each rank's power over one iteration of ``plan`` (one pipeline, one GPU per rank)."""
    return rank_power_of(problem, *_node_schedule(problem, plan))


def rank_power_of(
    problem: EnergyProblem, es: FloatArray, d: FloatArray, e: FloatArray
) -> RankPower:
    """:func:`rank_power` from the nodes' earliest starts, durations and energies."""
    period = float((es + d).max())
    busy = d > 0
    start, end = es[busy], (es + d)[busy]
    excess = e[busy] / d[busy] - problem.blocking_power
    ranks = problem.dag.rank[busy]
    times = np.unique(np.concatenate([[0.0, period], start, end]))
    # Merge breakpoints closer than floating-point noise (a node ending where another starts).
    keep = np.concatenate([[True], np.diff(times) > 1e-12 * max(period, 1.0)])
    times = times[keep]
    times[-1] = period
    m = len(times) - 1
    k0 = np.clip(np.searchsorted(times, start, side="left"), 0, m)
    k1 = np.clip(np.searchsorted(times, end, side="left"), 0, m)
    k0 = _snap(times, start, k0)
    k1 = _snap(times, end, k1)
    r = problem.dag.num_ranks
    delta = np.bincount(
        np.concatenate([ranks * (m + 1) + k0, ranks * (m + 1) + k1]),
        weights=np.concatenate([excess, -excess]),
        minlength=r * (m + 1),
    ).reshape(r, m + 1)
    watts = np.asarray(problem.blocking_power + np.cumsum(delta, axis=1)[:, :m], dtype=np.float64)
    return RankPower(times, watts, float(problem.blocking_power))


def _snap(times: FloatArray, x: FloatArray, k: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The breakpoint nearest to each ``x`` among ``times[k - 1]`` and ``times[k]``."""
    prev = np.maximum(k - 1, 0)
    nxt = np.minimum(k, len(times) - 1)
    return np.where(np.abs(times[prev] - x) < np.abs(times[nxt] - x), prev, nxt)


def plan_timeline(
    problem: EnergyProblem, plan: PlanArray, *, pipelines: int = 1, tensor_parallel: int = 1
) -> PowerTimeline:
    """The job's power over one iteration of ``plan``: every GPU of every pipeline."""
    return rank_power(problem, plan).total(pipelines * tensor_parallel)
