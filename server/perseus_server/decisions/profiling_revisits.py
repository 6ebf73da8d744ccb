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
* *effective cost* (:func:`cost_needs`): clock ``j``'s *margin* is the most, over prices
  ``lambda >= 0``, by which ``c_j + lambda t_j`` beats every other clock's (negative: by how
  little it loses at its best price). A margin beyond ``sigmas`` combined standard errors
  (``sqrt(se_c[j]^2 + se_c[k]^2)``, ``k`` the best other clock at that price) either way is
  told apart: the clock surely is, or surely is not, some price's choice. Within them, while
  that combined error exceeds ``cost_tolerance`` of ``|e[k]|``, the less certain of ``j`` and
  ``k`` is needed. The margin is the lower envelope of the others' lines minus ``j``'s line:
  concave and piecewise linear in ``lambda``, so its maximum is at ``0`` or at a price where
  two clocks tie; those prices are tried. The fastest clock wins at a high enough price
  whatever its cost: it is left to the time needs.

**Choice.** :func:`next_revisit` counts, per clock, the (stage, instruction)s that need it (a
revisit measures every instruction at that clock) and picks the clock with the most time needs,
then the most cost needs, then the highest.

**Complexity.** ``O(m^3)`` per curve of ``m`` clocks (``O(m^2)`` prices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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
    """The clocks to measure again so that the zero-slowdown plan is not late on noise.

    See the module docstring.
    """
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
    """The clocks to measure again so that the frontier's close choices are told apart.

    The choices are between clocks; see the module docstring.
    """
    freqs, t, c, se = curve.frequencies, curve.time, curve.cost, curve.cost_se
    m = len(freqs)
    if cost_tolerance <= 0 or m < 2 or not np.all(se > 0):
        return set()
    dt = t[None, :] - t[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = (c[:, None] - c[None, :]) / dt
    prices = np.concatenate(([0.0], slopes[(dt > 0) & (slopes > 0)]))
    v = c[None, :] + prices[:, None] * t[None, :]
    order = np.argsort(v, axis=1)[:, :2]
    rows = np.arange(len(prices))
    fastest = int(np.argmin(t))
    need: set[int] = set()
    for j in range(m):
        if j == fastest and np.count_nonzero(t <= t[j]) == 1:
            continue  # a high enough price makes it every other clock's better: times decide
        # the best other clock at each price, and how much j beats it there
        other = np.where(order[:, 0] == j, order[:, 1], order[:, 0])
        margin = v[rows, other] - v[:, j]
        best = int(np.argmax(margin))
        k = int(other[best])
        sd = math.hypot(se[j], se[k])
        if abs(margin[best]) <= sigmas * sd and sd > cost_tolerance * abs(curve.energy[k]):
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
