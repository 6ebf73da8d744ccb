"""The relaxation's contract: a certified lower bound on the energy of any plan, as a function of
the iteration time ``T``.

The relaxed optimum ``G(T)`` (see :mod:`perseus.solver.relaxation`) is convex and piecewise
linear; the energy bound is ``B(T) = G(T) + P R T`` (``P`` the blocking power, ``R`` the ranks).
A relaxation core hands ``B`` on in one of two representations, and every user evaluates it
through :class:`RelaxedBound`, never by interpolating arrays itself:

- **breakpoints** ``(T_k, B_k)``: *every* breakpoint of ``B`` between the fastest time and the
  time ``t_max`` past which ``G`` stops falling (the exact sweep's output). Linear
  interpolation between them is ``B`` itself, which is a valid lower bound only because no
  breakpoint is missing: between two points of a convex function that is not piecewise linear
  on exactly those pieces, the chord lies *above* it. Past the last breakpoint the bound grows
  at ``P R`` (the plan waits).
- **tangents** ``(T_k, B_k, s_k)``: ``B`` known exactly at some deadlines, with a subgradient
  there (the slope of a supporting line). ``B(T) >= max_k B_k + s_k (T - T_k)`` for every ``T``
  (a convex function lies above its supporting lines; each line is also certified on its own
  by the LP's duality: any circulation's potentials give one), so the maximum of the lines is
  certified everywhere, exact at every ``T_k``, and lower than ``B`` in between by at most the
  gap a chord-tangent sandwich measured. No tail is added: a core that wants the bound exact past
  ``t_max`` keeps a tangent there (slope ``P R``).

Both give :meth:`RelaxedBound.bound` (``inf`` below the fastest time), :meth:`RelaxedBound.slope`
and :meth:`RelaxedBound.time_for_power`; a bound that carries relaxed solutions also gives
:meth:`RelaxedBound.durations_at` (a convex combination of two kept solutions: feasible for the
same combination of their deadlines, since the longest path is convex in the durations).
Below the first time by a relative ``1e-9`` (the sweep may end that far past the fastest time)
the bound reads as at the first time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["RelaxedBound", "envelope", "interpolate_durations"]

FloatArray = npt.NDArray[np.float64]
#: Relative slack below the first time that still reads as the first time.
TIME_SLACK = 1e-9


@dataclass(frozen=True, eq=False)
class RelaxedBound:
    """A certified lower bound ``B(T)`` on the energy (J) of any plan that finishes within ``T``.

    Attributes:
        kind: ``"breakpoints"`` or ``"tangents"`` (see the module's docstring).
        times: ``(b,)`` increasing times (s): the breakpoints, or the deadlines solved exactly.
        values: ``(b,)`` the bound there (J).
        slopes: ``(b,)`` the tangent lines' slopes (J/s) for ``"tangents"``; empty otherwise.
        tail_slope: for ``"breakpoints"``, how fast the bound grows past the last breakpoint
            (``P R``: everything waits at blocking power).
        kept_times, kept_durations: ``(k,)`` and ``(k, n)``, relaxed solutions at some
            deadlines (optional; the solver keeps them, a stored frontier does not).
    """

    kind: Literal["breakpoints", "tangents"]
    times: FloatArray
    values: FloatArray
    slopes: FloatArray
    tail_slope: float = 0.0
    kept_times: FloatArray | None = None
    kept_durations: FloatArray | None = None

    @classmethod
    def breakpoints(
        cls, times: npt.ArrayLike, values: npt.ArrayLike, tail_slope: float, **kept: Any
    ) -> RelaxedBound:
        """Every breakpoint of the convex ``B`` up to where ``G`` stops falling."""
        t, v = _checked(times, values)
        return cls("breakpoints", t, v, np.empty(0), float(tail_slope), **kept)

    @classmethod
    def tangents(
        cls, times: npt.ArrayLike, values: npt.ArrayLike, slopes: npt.ArrayLike, **kept: Any
    ) -> RelaxedBound:
        """Supporting lines of ``B``: ``B(T) >= values[k] + slopes[k] (T - times[k])``."""
        t, v = _checked(times, values)
        s = np.asarray(slopes, dtype=np.float64).reshape(-1)
        if s.shape != t.shape or not np.isfinite(s).all():
            raise ValueError("slopes: one finite slope per time")
        return cls("tangents", t, v, s, 0.0, **kept)

    @classmethod
    def from_arrays(
        cls, times: npt.ArrayLike, values: npt.ArrayLike, slopes: npt.ArrayLike, tail_slope: float
    ) -> RelaxedBound:
        """Tangents when ``slopes`` is non-empty, breakpoints otherwise (a stored frontier)."""
        s = np.asarray(slopes, dtype=np.float64).reshape(-1)
        if s.size:
            return cls.tangents(times, values, s)
        return cls.breakpoints(times, values, tail_slope)

    @property
    def t_min(self) -> float:
        """The fastest time the bound covers (``inf`` when it is empty)."""
        return float(self.times[0]) if self.times.size else math.inf

    def bound(self, deadlines: npt.ArrayLike) -> Any:
        """``B`` at each deadline (a float for a scalar): ``inf`` below the fastest time."""
        d = np.asarray(deadlines, dtype=np.float64)
        out = self._bound(np.atleast_1d(d).reshape(-1)).reshape(d.shape)
        return float(out) if out.ndim == 0 else out

    def _bound(self, d: FloatArray) -> FloatArray:
        t, v = self.times, self.values
        if t.size == 0:
            return np.full(d.shape, np.inf)
        if self.kind == "tangents":
            out = (v[None, :] + self.slopes[None, :] * (d[:, None] - t[None, :])).max(axis=1)
        else:
            out = np.interp(d, t, v)
            past = d > t[-1]
            out[past] = v[-1] + self.tail_slope * (d[past] - t[-1])
        out[d < t[0] * (1 - TIME_SLACK)] = np.inf
        result: FloatArray = out
        return result

    def slope(self, deadlines: npt.ArrayLike) -> Any:
        """A subgradient of the bound at each deadline (the slope of the piece or line that
        holds it up, on the right of a breakpoint); ``nan`` below the fastest time."""
        d = np.asarray(deadlines, dtype=np.float64)
        x = np.atleast_1d(d).reshape(-1)
        t, v = self.times, self.values
        if t.size == 0:
            out = np.full(x.shape, np.nan)
        elif self.kind == "tangents":
            lines = v[None, :] + self.slopes[None, :] * (x[:, None] - t[None, :])
            out = self.slopes[np.argmax(lines, axis=1)]
        else:
            seg = np.diff(v) / np.where(np.diff(t) > 0, np.diff(t), 1.0)
            seg = np.append(seg, self.tail_slope)
            out = seg[np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(seg) - 1)]
        out = np.where(x < t[0] * (1 - TIME_SLACK), np.nan, out) if t.size else out
        shaped: npt.NDArray[np.float64] = np.asarray(out).reshape(d.shape)
        return float(shaped) if shaped.ndim == 0 else shaped

    def time_for_power(self, watts: float) -> float:
        """The least ``T`` at or past the fastest time with ``B(T) <= watts * T`` (``inf`` when
        there is none). ``B(T) - w T`` is convex: for breakpoints, the first breakpoint under the
        line and the piece before it; for tangents, each line gives a lower or an upper limit on
        ``T``. ``O(b)``."""
        w = float(watts)
        t, v = self.times, self.values
        if t.size == 0:
            raise ValueError("the bound is empty (no times)")
        if self.kind == "tangents":
            s = self.slopes
            a = v - s * t  # line k: a_k + s_k T <= w T
            lo, hi = float(t[0]), math.inf
            rising = s < w
            if rising.any():
                lo = max(lo, float((a[rising] / (w - s[rising])).max()))
            falling = s > w
            if falling.any():
                hi = float((a[falling] / (w - s[falling])).min())
            level = s == w
            if (level & (a > 0)).any() or lo > hi * (1 + 1e-12):
                return math.inf
            return lo
        g = v - w * t
        below = np.flatnonzero(g <= 0)
        if below.size:
            k = int(below[0])
            if k == 0:
                return float(t[0])
            # linear on [t[k-1], t[k]]: g falls from > 0 to <= 0
            return float(t[k - 1] + g[k - 1] / (g[k - 1] - g[k]) * (t[k] - t[k - 1]))
        if w <= self.tail_slope:
            return math.inf
        return float((v[-1] - self.tail_slope * t[-1]) / (w - self.tail_slope))

    def durations_at(self, deadlines: FloatArray) -> FloatArray:
        """Relaxed durations at each deadline (``(k, n)``), interpolated between the kept
        solutions (see :func:`interpolate_durations`)."""
        if self.kept_times is None or self.kept_durations is None:
            raise ValueError("this bound carries no relaxed solutions (durations_at)")
        return interpolate_durations(self.kept_times, self.kept_durations, deadlines)

    def to_json(self) -> dict[str, Any]:
        """``{"times", "values"}`` plus ``"slopes"`` (tangents) or ``"tail_slope"``."""
        doc: dict[str, Any] = {"kind": self.kind, "times": self.times.tolist()}
        doc["values"] = self.values.tolist()
        if self.kind == "tangents":
            doc["slopes"] = self.slopes.tolist()
        else:
            doc["tail_slope"] = self.tail_slope
        return doc


def envelope(
    curves: list[tuple[FloatArray, FloatArray]], tail_slope: float
) -> tuple[FloatArray, FloatArray]:
    """The breakpoints ``(times, values)`` of the pointwise maximum of convex functions.

    Each function is piecewise linear, given by all its breakpoints, and grows at
    ``tail_slope`` past its last.

    Each function is a certified bound, so their maximum is one too, and it is convex and
    piecewise linear: its breakpoints are the functions' own and the points where two of them
    cross. On each interval between consecutive breakpoints of any function every function is
    linear, so the crossings there are those of lines. Below the latest first time the
    maximum is taken over the functions defined there (a function is ``inf`` below its first
    time, so the maximum starts at the latest start: every curve of the solver starts at the
    same fastest time). ``O(c^2 b)`` for ``c`` functions of ``b`` breakpoints.
    """
    start = max(float(t[0]) for t, _ in curves)
    end = max(float(t[-1]) for t, _ in curves)
    grid = np.unique(np.concatenate([t for t, _ in curves] + [np.array([start, end])]))
    grid = grid[(grid >= start) & (grid <= end)]

    def at(x: FloatArray) -> FloatArray:
        rows = []
        for t, v in curves:
            y = np.interp(x, t, v)
            past = x > t[-1]
            y[past] = v[-1] + tail_slope * (x[past] - t[-1])
            rows.append(y)
        return np.array(rows)

    vals = at(grid)
    extra = []
    for a in range(len(curves)):
        for b in range(a + 1, len(curves)):
            diff = vals[a] - vals[b]
            cross = np.flatnonzero(diff[:-1] * diff[1:] < 0)
            w = diff[cross] / (diff[cross] - diff[cross + 1])
            extra.append(grid[cross] + w * (grid[cross + 1] - grid[cross]))
    times = np.unique(np.concatenate([grid, *extra]))
    values: FloatArray = at(times).max(axis=0)
    return times, values


def interpolate_durations(
    kept_times: FloatArray, kept_durations: FloatArray, deadlines: FloatArray
) -> FloatArray:
    """Durations at each of ``deadlines`` (``(k, n)``): the convex combination of the two kept
    solutions around it (clamped to the first and the last). Each kept row is feasible for its
    own time and the longest path is convex in the durations, so the combination is feasible
    for the same combination of times; between two consecutive breakpoints of ``G`` it is the
    relaxed optimum itself."""
    bp_t, bp_d = kept_times, kept_durations
    j = np.clip(np.searchsorted(bp_t, deadlines, side="right") - 1, 0, len(bp_t) - 1)
    k = np.minimum(j + 1, len(bp_t) - 1)
    span = bp_t[k] - bp_t[j]
    w = np.where(span > 0, (deadlines - bp_t[j]) / np.where(span > 0, span, 1.0), 0.0)
    w = np.clip(w, 0.0, 1.0)[:, None]
    out: FloatArray = (1 - w) * bp_d[j] + w * bp_d[k]
    return out


def _checked(times: npt.ArrayLike, values: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    t = np.asarray(times, dtype=np.float64).reshape(-1)
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if t.shape != v.shape:
        raise ValueError(f"times and values: {t.size} times but {v.size} values")
    if not (np.isfinite(t).all() and np.isfinite(v).all()):
        raise ValueError("times and values: must be finite")
    if t.size > 1 and (np.diff(t) < 0).any():
        raise ValueError("times: must be non-decreasing")
    return t, v
