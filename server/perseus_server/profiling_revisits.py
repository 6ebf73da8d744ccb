"""Which clocks an online-profiling scan measures again after its descending pass.

**Problem.** After the scan every (stage, instruction) has, per clock, a mean time and energy
with standard errors. The frontier picks, per instruction, the clock that minimises
``c + lambda * t`` for some price ``lambda >= 0`` of its time (``c = e - P_b * t``, the
effective cost): ``lambda`` is large on the critical path at the zero-slowdown plan and zero for
an instruction with slack (its valley). Where two clocks' values are within the noise of each
other, the measured profile picks one of them by chance, and a wrong pick costs the true
difference: small per instruction, but it adds up over every instruction of the pipeline. Only
those close choices are worth measuring again; a clock that no price makes competitive (past
the valley, or far above the curve's lower hull) is not.

**Two needs.** Per (stage, instruction), on its curve (clocks highest first):

* *time* (:func:`time_needs`): the zero-slowdown plan gives a critical instruction a lower
  clock only where it is as fast as the highest. The highest clock is needed while its time's
  standard error exceeds ``top_tolerance`` of its time, and every clock that draws less energy
  and whose time is within ``sigmas`` combined standard errors of the highest's while that
  combined error exceeds ``top_tolerance`` of it (the less certain of the two);
* *effective cost* (:func:`cost_needs`): for each price ``lambda`` at a vertex of the lower
  convex hull of ``(t, c)`` (and ``lambda = 0``), the clock ``k`` with the least
  ``c + lambda t`` and every clock ``j`` within ``sigmas`` combined standard errors of it
  (``sqrt(se_c[j]^2 + se_c[k]^2)``) while that combined error exceeds ``cost_tolerance`` of
  ``|e[k]|``: the less certain of ``j`` and ``k`` is needed. The gap ``c_j + lambda t_j -
  min_k(c_k + lambda t_k)`` is convex in ``lambda`` (linear minus concave), so its minimum over
  ``lambda >= 0`` is at ``0`` or at a hull vertex's slope: these prices find every clock any
  price makes competitive.

**Choice.** :func:`next_revisit` counts, per clock, the (stage, instruction)s that need it (a
revisit measures every instruction at that clock) and picks the clock with the most time needs,
then the most cost needs, then the highest.

**Complexity.** ``O(m h)`` per curve of ``m`` clocks and ``h`` hull vertices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perseus.profiles import lower_hull_indices, pareto_indices

__all__ = ["Curve", "time_needs", "cost_needs", "next_revisit"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Curve:
    """One (stage, instruction)'s measured means over clocks, highest clock first."""

    frequencies: IntArray
    time: FloatArray
    time_se: FloatArray
    energy: FloatArray
    #: effective cost ``energy - P_b * time`` and its standard error
    cost: FloatArray
    cost_se: FloatArray


def time_needs(curve: Curve, *, sigmas: float, top_tolerance: float) -> set[int]:
    """The clocks to measure again so that the zero-slowdown plan is not late on noise (see
    the module docstring)."""
    freqs, t, t_se, e = curve.frequencies, curve.time, curve.time_se, curve.energy
    if top_tolerance <= 0 or len(freqs) < 2 or not np.all(t_se > 0):
        return set()
    top_se, bar = t_se[0], top_tolerance * t[0]
    need = {int(freqs[0])} if top_se > bar else set()
    for j in range(1, len(freqs)):
        sd = math.hypot(t_se[j], top_se)
        if e[j] < e[0] and t[j] - t[0] <= sigmas * sd and sd > bar:
            need.add(int(freqs[j] if t_se[j] >= top_se else freqs[0]))
    return need


def cost_needs(curve: Curve, *, sigmas: float, cost_tolerance: float) -> set[int]:
    """The clocks to measure again so that the frontier's close choices between clocks are
    told apart (see the module docstring)."""
    freqs, t, c, se = curve.frequencies, curve.time, curve.cost, curve.cost_se
    if cost_tolerance <= 0 or len(freqs) < 2 or not np.all(se > 0):
        return set()
    front = pareto_indices(t, c)
    hull = front[lower_hull_indices(t[front], c[front])]
    prices = [0.0]
    for a, b in zip(hull[:-1], hull[1:], strict=True):
        prices.append(float((c[a] - c[b]) / (t[b] - t[a])))
    need: set[int] = set()
    for lam in prices:
        v = c + lam * t
        k = int(np.argmin(v))
        sd = np.hypot(se, se[k])
        close = (v - v[k] <= sigmas * sd) & (sd > cost_tolerance * abs(curve.energy[k]))
        close[k] = False
        for j in np.flatnonzero(close):
            need.add(int(freqs[j] if se[j] >= se[k] else freqs[k]))
    return need


def next_revisit(
    curves: list[Curve],
    *,
    sigmas: float,
    top_tolerance: float,
    cost_tolerance: float,
) -> int | None:
    """The clock to measure again next (see the module docstring, *Choice*), or ``None``."""
    counts: dict[int, list[int]] = {}
    for curve in curves:
        for f in time_needs(curve, sigmas=sigmas, top_tolerance=top_tolerance):
            counts.setdefault(f, [0, 0])[0] += 1
        for f in cost_needs(curve, sigmas=sigmas, cost_tolerance=cost_tolerance):
            counts.setdefault(f, [0, 0])[1] += 1
    if not counts:
        return None
    return max(counts, key=lambda f: (counts[f][0], counts[f][1], f))
