"""The statistics the report observers share, each defined once.

* :func:`median`: the one median (a sort and the middle; the mean of the two middle values of
  an even count). The iteration detector's T' (the median of a pipeline's slow iterations), a
  link's time and a scan's transfer fit are medians.
* :func:`calibration`: the common overhead of a job's pipelines, the smallest over the
  pipelines of the median of their recent ratios of measured to planned iteration time (the
  healthiest pipeline's overhead). The straggler detector compares ratios against it; the
  profile check (``profile_mismatch``) judges it against its band.
* :func:`overhead`: that pipeline's median ratio (the calibration) and its overhead in seconds,
  the median of its recent excesses of measured over planned time, in one pass. The straggler
  detector takes the seconds out of T'.
* :func:`stage_factors`: one iteration's slowdown factor per stage, the median of its
  measurements' ratios of measured over profiled time.
* :func:`link_time`: one iteration's time of a link from its microbatches' transfer times:
  their median (what the status shows and profiling fits) and the fastest (what slow-link
  detection compares).

A change of one of these statistics is a change of this module and its test
(``tests/server/decisions/test_report_statistics.py``); every caller reaches it through here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["calibration", "link_time", "median", "overhead", "stage_factors"]


def median(values: Iterable[float] | npt.NDArray[np.float64]) -> float:
    """The median of ``values`` (at least one).

    The middle of the sorted values, or the mean of the two middle ones. An array is sorted by
    numpy (``O(n log n)``, a few microseconds for a small report, where :func:`numpy.median`'s
    overhead is a hundred times that).
    """
    a: Sequence[float] | npt.NDArray[np.float64]
    a = np.sort(values) if isinstance(values, np.ndarray) else sorted(values)
    h = len(a) // 2
    return float(a[h]) if len(a) % 2 else float((a[h - 1] + a[h]) / 2)


def calibration(windows: Iterable[Collection[float]], full: int = 1) -> float | None:
    """The smallest median over the ``windows`` holding at least ``full`` values.

    None when none does.

    A job's common overhead from each pipeline's recent ratios of measured to planned iteration
    time.
    """
    medians = [median(w) for w in windows if len(w) >= max(1, full)]
    return min(medians) if medians else None


def overhead(
    windows: Iterable[tuple[Collection[float], Collection[float]]],
) -> tuple[float, float] | None:
    """The healthiest pipeline's ``(median ratio, overhead in seconds)``; None when none has values.

    ``windows``: per pipeline, its recent ratios of measured to planned iteration time and its
    recent excesses of measured over planned time (seconds), of the same iterations. The
    pipeline is the one whose median ratio is the smallest (the :func:`calibration`, which comes
    first); its overhead is the median of its excesses. Both in one pass over the pipelines.
    """
    best: tuple[float, float] | None = None
    for ratios, excesses in windows:
        if ratios and excesses:
            m = median(ratios)
            if best is None or m < best[0]:
                best = (m, median(excesses))
    return best


def stage_factors(
    ratios: Mapping[int, Sequence[float] | npt.NDArray[np.float64]],
) -> dict[int, float]:
    """One iteration's slowdown factor per stage, stages in the order given.

    Each stage's factor is the median of its ratios of measured over profiled time (one per
    measured instruction).
    """
    return {stage: median(np.asarray(r, dtype=np.float64)) for stage, r in ratios.items()}


def link_time(times: Collection[float]) -> tuple[float, float]:
    """One iteration's time of a link: ``(median, fastest)``.

    From its microbatches' transfer times (at least one).
    """
    return median(times), min(times)
