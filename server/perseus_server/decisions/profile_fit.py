"""Smoothing a measured curve across clocks where the measurements allow it.

**Problem.** Online profiling measures, per (stage, instruction), the mean time at every clock
with a standard error ``se`` from the samples' spread. The zero-slowdown plan is set by the
fastest clocks' times, and a time error of a tenth of the noise makes it late: the frontier
takes a clock whose mean happens to read as fast as the highest clock's. Neighbouring clocks
measure nearly the same curve, so pooling them averages the noise down; but a real GPU's curve
is not one smooth function (a power cap flattens the top clocks, some clocks are faster than
their neighbours), and pooling across such a feature would bias the value by far more than the
noise.

**Method.** Local polynomial regression (degree ``degree`` in the clock, weights ``1/se^2``)
with an adaptive window chosen per point by the intersection of confidence intervals rule
(Katkovnik, "A new method for varying adaptive bandwidth selection", IEEE Trans. Signal
Process. 47, 1999; a form of Lepski's method): at point ``j`` the window grows one clock on each
side at a time (``h = 0`` is the point's own mean), and a wider window is accepted only while
the intervals ``estimate +- sigmas * standard error`` of every window so far still intersect.
A window stops growing at the first one whose estimate departs from the narrower ones by more
than the noise explains, i.e. where the curve stops looking like one polynomial: a point next
to a real feature keeps its own mean (or a narrow window), a point on a smooth stretch pools many clocks. With no noise estimate (a ``se`` of zero: one sample, or no spread) the
curve is returned as measured.

**Complexity.** ``O(m * H * d^3)`` for ``m`` clocks, at most ``H`` half-widths and degree ``d``.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["smooth_curve"]

FloatArray = npt.NDArray[np.float64]


def smooth_curve(
    frequencies: npt.ArrayLike,
    means: npt.ArrayLike,
    standard_errors: npt.ArrayLike,
    *,
    sigmas: float = 2.0,
    degree: int = 2,
    max_half_width: int = 8,
) -> tuple[FloatArray, FloatArray]:
    """Adaptive local-polynomial estimates of a curve (see the module docstring).

    Args:
        frequencies: the clocks (any order; estimates are per point).
        means: the measured mean at each clock.
        standard_errors: each mean's standard error (all positive, else no smoothing).
        sigmas: the half-width of each window's confidence interval, in standard errors.
        degree: the local polynomial's degree (a window of ``w`` points fits at most
            ``w - 2``, so every accepted fit has residual degrees of freedom).
        max_half_width: the widest window, in clocks on each side.

    Returns:
        ``(values, standard_errors)`` of the estimates, one per clock.
    """
    f = np.asarray(frequencies, dtype=np.float64)
    y = np.asarray(means, dtype=np.float64)
    se = np.asarray(standard_errors, dtype=np.float64)
    if not (f.shape == y.shape == se.shape) or f.ndim != 1:
        raise ValueError("frequencies, means and standard_errors must be 1-D of one length")
    m = len(y)
    if m < 3 or not np.all(se > 0) or not np.all(np.isfinite(se)) or not math.isfinite(sigmas):
        return y.copy(), se.copy()
    order = np.argsort(-f, kind="stable")
    fs, ys, ss = f[order], y[order], se[order]
    w = 1.0 / ss**2
    scale = max(1.0, float(fs[0] - fs[-1]))
    out, out_se = ys.copy(), ss.copy()
    for j in range(m):
        accepted = [(ys[j], ss[j])]
        lo_bound, hi_bound = ys[j] - sigmas * ss[j], ys[j] + sigmas * ss[j]
        for h in range(1, max_half_width + 1):
            lo, hi = max(0, j - h), min(m, j + h + 1)
            d = min(degree, hi - lo - 2)
            if d < 0:
                continue
            x = (fs[lo:hi] - fs[j]) / scale
            basis = np.vander(x, d + 1, increasing=True)
            ww = w[lo:hi]
            gram = basis.T @ (basis * ww[:, None])
            try:
                cov = np.linalg.inv(gram)
            except np.linalg.LinAlgError:
                break
            beta = cov @ (basis.T @ (ww * ys[lo:hi]))
            est, est_se = float(beta[0]), math.sqrt(max(float(cov[0, 0]), 0.0))
            lo_bound = max(lo_bound, est - sigmas * est_se)
            hi_bound = min(hi_bound, est + sigmas * est_se)
            if lo_bound > hi_bound:
                break
            accepted.append((est, est_se))
            if lo == 0 and hi == m:
                break
        out[j], out_se[j] = accepted[-1]
    values, errors = np.empty(m), np.empty(m)
    values[order], errors[order] = out, out_se
    return values, errors
