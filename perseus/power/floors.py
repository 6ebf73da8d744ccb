"""Power floors: the least extra power that keeps a plan's swing and ramps within bounds.

A *floor* ``[start_s, end_s, watts]`` on a rank makes its GPU draw at least ``watts`` over that
part of every iteration (NVML power smoothing's floor, or a busy loop): the rank then draws
``max(p_r(t), f_r(t))``. Given a plan's rank powers (:func:`perseus.power_timeline.rank_power`)
and the bounds

* ``swing = 1 - trough / peak <= max_swing`` and
* every change within ``window`` seconds ``<= max_ramp * peak``,

:func:`least_floors` finds the floors of least energy among those that hold one level per
*piece* on every rank that would draw less: the pieces ``s`` are those between the rank
powers' breakpoints, each cut into parts at most ``resolution`` seconds long (default a fifth
of the window, so that a ramp can climb in steps), and in piece ``s`` every rank draws at least
``lambda_s`` (water-filling: the fill goes to the GPUs that draw least). The job then draws
``R_s(lambda) = sum_r max(p_rs, lambda_s)``, increasing in ``lambda``, and the bounds read::

    R_s >= (1 - max_swing) * M              (M: the peak)
    R_s >= R_s' - max_ramp * M              for every piece s' less than a window away

A pointwise minimum of two solutions is a solution (each constraint involves one piece's level
on each side, and ``min`` keeps ``|a - b| <= D``), so a least solution exists, and it has the
least energy, the integral of ``R - P``. It is the least fixed point of "raise each piece just
enough for its targets", reached from ``lambda = 0`` by that monotone iteration (each
pass carries the ramp one window further; a pass is ``O(m log m)`` for ``m`` pieces). The peak
``M`` is the plan's own: no target exceeds it, so the floors never raise the peak.

The two floor-only references of the issue are here too: :func:`uniform_floor` (one level on
every GPU all iteration long, the least that meets both bounds) and :func:`trough_fill_energy`
(the job's power filled up to ``(1 - max_swing) * peak`` exactly where and as much as it falls
below, the ramp ignored).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from perseus.errors import OptionError
from perseus.power_timeline import DEFAULT_WINDOW, PowerTimeline, RankPower

__all__ = [
    "SwingBounds",
    "Floors",
    "least_floors",
    "floor_energy",
    "uniform_floor",
    "trough_fill_energy",
    "meets",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Floating-point slack when checking a timeline against its bounds (a millionth of the peak).
_TOL = 1e-6


@dataclass(frozen=True)
class SwingBounds:
    """What an operator's utility asks of a job's power.

    Attributes:
        max_swing: the largest ``1 - trough / peak`` (``None``: unbounded).
        max_ramp: the largest change within ``window``, as a fraction of the peak (``None``:
            unbounded).
        window: seconds of the ramp's window (default 0.1).
    """

    max_swing: float | None = None
    max_ramp: float | None = None
    window: float = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        """Check every bound, naming the field."""
        for name in ("max_swing", "max_ramp"):
            v = getattr(self, name)
            if v is not None and not (
                isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= 1
            ):
                raise OptionError(f"{name} must be a number in [0, 1], got {v!r}", field=name)
        w = self.window
        if not (isinstance(w, int | float) and math.isfinite(w) and 0 < w <= 3600):
            raise OptionError(
                f"window must be a number of seconds in (0, 3600], got {w!r}", field="window"
            )

    @property
    def bounded(self) -> bool:
        """Whether anything is bounded at all."""
        return self.max_swing is not None or self.max_ramp is not None

    def to_json(self) -> dict[str, Any]:
        """``{"max_swing", "max_ramp", "window"}``."""
        return {"max_swing": self.max_swing, "max_ramp": self.max_ramp, "window": self.window}


def meets(timeline: PowerTimeline, bounds: SwingBounds) -> bool:
    """Whether ``timeline`` keeps within ``bounds`` (up to floating-point slack)."""
    peak = timeline.peak
    if bounds.max_swing is not None and timeline.swing > bounds.max_swing + _TOL:
        return False
    return not (
        bounds.max_ramp is not None
        and timeline.max_change(bounds.window) > (bounds.max_ramp + _TOL) * peak
    )


@dataclass(frozen=True)
class Floors:
    """Per-rank floors of one pipeline and what they cost.

    Attributes:
        ranks: per pipeline rank, ``[start_s, end_s, watts]`` within one iteration.
        energy: joules per iteration they add, one pipeline.
        timeline: the pipeline's power with them (one pipeline).
    """

    ranks: list[list[tuple[float, float, float]]]
    energy: float
    timeline: PowerTimeline

    def to_json(self) -> list[list[list[float]]]:
        """``power_floors``: per rank, ``[[start_s, end_s, watts], ...]``."""
        return [[[s, e, w] for s, e, w in r] for r in self.ranks]


@dataclass(frozen=True)
class _Pieces:
    """The rank powers cut into pieces; piece ``s`` holds level ``cell[s]`` (its own)."""

    start: FloatArray
    end: FloatArray
    power: FloatArray  # (R, m)
    cell: IntArray
    cells: int
    period: float


def _pieces(ranks: RankPower, resolution: float) -> _Pieces:
    """The rank powers' pieces, each cut into parts at most ``resolution`` long."""
    period = float(ranks.times[-1])
    lengths = np.diff(ranks.times)
    parts = np.maximum(1, np.ceil(lengths / resolution - 1e-9)).astype(np.int64)
    owner = np.repeat(np.arange(len(lengths)), parts)
    first = np.concatenate([[0], np.cumsum(parts)[:-1]])
    j = np.arange(len(owner)) - first[owner]
    start = ranks.times[owner] + lengths[owner] * j / parts[owner]
    end = ranks.times[owner] + lengths[owner] * (j + 1) / parts[owner]
    end[-1] = period
    return _Pieces(start, end, ranks.watts[:, owner], np.arange(len(owner)), len(owner), period)


class _NeighbourMax:
    """For every piece, the largest value among the pieces less than ``window`` away.

    The ranges depend only on the pieces, so they are found once per :func:`_solve_levels` and
    each of its iterations only takes the maxima (a sparse table over three periods' values).
    """

    def __init__(self, pc: _Pieces, window: float) -> None:
        m = len(pc.start)
        self.whole = window >= pc.period
        if self.whole:
            return
        shift = np.array([-pc.period, 0.0, pc.period])
        start = (pc.start[None, :] + shift[:, None]).ravel()
        end = (pc.end[None, :] + shift[:, None]).ravel()
        first = np.searchsorted(end, pc.start - window, side="right")
        last = np.searchsorted(start, pc.end + window, side="left") - 1
        first = np.maximum(first, np.arange(m) + 1)  # at most one period's worth either way
        last = np.minimum(last, np.arange(m) + 2 * m - 1)
        length = last - first + 1
        level = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
        self.top = int(level.max()) if m else 0
        self.groups = [
            (sel, first[sel], last[sel] - (1 << int(lv)) + 1, int(lv))
            for lv in np.unique(level).tolist()
            for sel in [np.flatnonzero(level == lv)]
        ]

    def __call__(self, values: FloatArray) -> FloatArray:
        """The neighbourhood maxima of ``values`` (one per piece)."""
        if self.whole:
            return np.full(len(values), values.max())
        vals = np.tile(values, 3)
        table = [vals]
        for lv in range(self.top):
            span = 1 << lv
            table.append(np.maximum(table[-1][:-span], table[-1][span:]))
        hi = np.empty(len(values))
        for sel, a, b, lv in self.groups:
            hi[sel] = np.maximum(table[lv][a], table[lv][b])
        return hi


class _LevelFor:
    """Per piece, the least ``lambda`` with ``sum_r max(p_r, lambda) >= need`` (0 if none).

    The ranks' powers sorted and summed once per :func:`_solve_levels`; each iteration gives
    only ``need``.
    """

    def __init__(self, power: FloatArray) -> None:
        p = np.sort(power, axis=0)[::-1]  # (R, m), largest first
        r = p.shape[0]
        top = np.concatenate([np.zeros((1, p.shape[1])), np.cumsum(p, axis=0)])  # sum of j largest
        self.rest = top[r - np.arange(1, r + 1)]  # sum of the r - k largest, k = 1..r
        self.k = np.arange(1, r + 1, dtype=np.float64)[:, None]
        self.total = top[r]

    def __call__(self, need: FloatArray) -> FloatArray:
        """The levels for ``need`` (W per piece)."""
        lam = ((need[None, :] - self.rest) / self.k).min(axis=0)
        return np.where(self.total >= need, 0.0, lam)


def _solve_levels(pc: _Pieces, bounds: SwingBounds, peak: float) -> FloatArray:
    """The least levels meeting the bounds against ``peak`` (the fixed point)."""
    low = 0.0 if bounds.max_swing is None else (1.0 - bounds.max_swing) * peak
    ramp = math.inf if bounds.max_ramp is None else bounds.max_ramp * peak
    level = np.zeros(pc.cells)
    neighbour_max = _NeighbourMax(pc, bounds.window)
    level_for = _LevelFor(pc.power)
    for _ in range(100_000):
        total = np.maximum(pc.power, level[pc.cell][None, :]).sum(axis=0)
        need = np.full(len(total), low)
        if math.isfinite(ramp):
            need = np.maximum(need, neighbour_max(total) - ramp)
        need = np.maximum(need, total)
        want = np.zeros(pc.cells)
        np.maximum.at(want, pc.cell, level_for(need))
        new = np.maximum(level, want)
        if np.all(new <= level + 1e-9 * max(peak, 1.0)):
            return level
        level = new
    raise RuntimeError("floor levels did not converge")  # pragma: no cover - bounded by peak


def least_floors(
    ranks: RankPower, bounds: SwingBounds, *, resolution: float | None = None
) -> Floors:
    """The least-energy floors that keep ``ranks``' summed power within ``bounds``."""
    pc, level, total, energy = _least(ranks, bounds, resolution)
    timeline = PowerTimeline(np.append(pc.start, pc.period), total)
    return Floors(_rank_floors(pc, level), energy, timeline)


def floor_energy(
    ranks: RankPower, bounds: SwingBounds, *, resolution: float | None = None
) -> float:
    """The joules :func:`least_floors` adds, without building the floors (for searches)."""
    return _least(ranks, bounds, resolution)[3]


def _least(
    ranks: RankPower, bounds: SwingBounds, resolution: float | None
) -> tuple[_Pieces, FloatArray, FloatArray, float]:
    """The pieces, their least levels, the power with them, and the joules they add."""
    res = bounds.window / 5 if resolution is None else float(resolution)
    pc = _pieces(ranks, res)
    level = _solve_levels(pc, bounds, float(ranks.watts.sum(axis=0).max()))
    total = np.maximum(pc.power, level[pc.cell][None, :]).sum(axis=0)
    energy = float(np.dot(pc.end - pc.start, total - pc.power.sum(axis=0)))
    return pc, level, total, energy


def _rank_floors(pc: _Pieces, level: FloatArray) -> list[list[tuple[float, float, float]]]:
    """Per rank, the pieces whose level it would otherwise draw less than, merged."""
    out: list[list[tuple[float, float, float]]] = []
    for r in range(pc.power.shape[0]):
        binding = level > pc.power[r] + 1e-9
        spans: list[tuple[float, float, float]] = []
        for c in np.flatnonzero(binding).tolist():
            w = float(level[c])
            s, e = float(pc.start[c]), float(pc.end[c])
            if spans and abs(spans[-1][1] - s) < 1e-12 and abs(spans[-1][2] - w) < 1e-9:
                spans[-1] = (spans[-1][0], e, w)
            else:
                spans.append((s, e, w))
        out.append(spans)
    return out


def uniform_floor(ranks: RankPower, bounds: SwingBounds) -> tuple[float, float]:
    """The least floor on every GPU all iteration long that meets ``bounds``: (W, J added)."""
    base = ranks.total()
    if meets(base, bounds):
        return 0.0, 0.0
    lo, hi = 0.0, float(ranks.watts.max())
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if meets(PowerTimeline(ranks.times, np.maximum(ranks.watts, mid).sum(axis=0)), bounds):
            hi = mid
        else:
            lo = mid
    tl = PowerTimeline(ranks.times, np.maximum(ranks.watts, hi).sum(axis=0))
    return hi, tl.energy - base.energy


def trough_fill_energy(ranks: RankPower, max_swing: float) -> float:
    """Joules added by filling the power up to ``(1 - max_swing) * peak`` wherever below."""
    base = ranks.total()
    low = (1.0 - max_swing) * base.peak
    return float(np.dot(np.diff(base.times), np.maximum(0.0, low - base.watts)))
