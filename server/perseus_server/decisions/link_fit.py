"""Measured P2P transfer times.

One report's time per link, and the fit online profiling gives the profile's communication part.

A *link* is one stage boundary in one direction, ``(boundary, direction)``. A rank times every
transfer it runs (one per microbatch); one report gives each link's **median** over them
(:func:`link_times`; the median, as for the stages' slowdown factors, so that one transfer
delayed by the host does not move it).

Both ends of a transfer may time it (the integrations do): each end's time is the transfer plus
its wait for the other end, so the smaller of the two is the transfer.
:class:`LinkCombiner` takes the reports of every end of a link and gives one time per iteration:
per microbatch the smallest of the ends' times, then their median. An iteration is complete
once every end that reported the link lately has reported it (one end: at once); an end silent
for :data:`STALE_ITERATIONS` is no longer waited for, and an iteration that old is taken as it
is. Online profiling keeps those per-report times per link
and clock (:class:`TransferSamples`, at most :data:`SAMPLES_KEPT` of the latest per link and
clock) and fits each link's time (:func:`fit_transfers`) by what the data supports:

- **one time per link and direction** (the median of every per-report time of the scan, all
  clocks together), unless
- **the producer's clock moves it by more than the measured noise**, two tests passed:

  1. *beyond the within-clock noise*: at least two clocks with :data:`MIN_PER_CLOCK` reports
     each, and two of their per-clock medians further apart than :data:`DEPENDENCE_Z` standard
     errors of that difference (:func:`clock_dependence`);
  2. *a trend in the clock, not a drift in time*: over at least three such clocks, the slope of
     the per-clock medians against the clock has a 99 % confidence interval that excludes 0 (a
     least-squares line, Student's t on the medians' scatter about it: :func:`clock_slope_t`).
     A scan measures one clock after another, so a host whose load changes during the scan (or
     a warm-up that ends) moves whole steps: their reports agree with each other, and test 1
     alone would read the step's shift as the clock's.

  The noise of test 1 is the within-clock spread,
  pooled over the link's clocks: the interquartile range of every report's difference from its
  clock's median, / 1.349 (a standard deviation that one outlier does not move, and that a host
  delaying some transfers by milliseconds widens as it should: a median absolute deviation would
  see only the undelayed mode); a median of ``n`` reports has a standard error of about
  1.2533 x that / sqrt(n). Then the link keeps one time per clock and its time is the one at the
  highest clock measured.

A gloo link's time does not depend on the GPU's SM clock; on a loaded host its per-report times
spread by milliseconds, and per-clock medians of a few reports each differ by noise alone: the
model would charge a clock for the host's delays and steer plans away from it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from perseus.profiles import Profile
from perseus_common.communication import Communication, Transfer
from perseus_server.decisions.report_statistics import link_time, median

__all__ = [
    "DEPENDENCE_Z",
    "MIN_PER_CLOCK",
    "SAMPLES_KEPT",
    "LinkCombiner",
    "LinkFit",
    "STALE_ITERATIONS",
    "TransferSamples",
    "SLOPE_CONFIDENCE",
    "clock_dependence",
    "clock_dependent",
    "clock_slope_t",
    "fit_transfers",
    "link_times",
    "with_measured_transfers",
]

#: Per-report times kept per link and clock during a scan (the latest ones).
SAMPLES_KEPT = 32
#: Per-clock medians further apart than this many standard errors: a dependence on the clock.
DEPENDENCE_Z = 3.5
#: The slope test's confidence (two-sided) that the per-clock medians trend with the clock.
SLOPE_CONFIDENCE = 0.99
#: Reports a clock needs before its median counts towards a dependence on the clock.
MIN_PER_CLOCK = 3
#: Iterations after which a link's silent end is no longer waited for.
STALE_ITERATIONS = 8

Link = tuple[int, str]


class _Transfer(Protocol):
    @property
    def boundary(self) -> int: ...
    @property
    def direction(self) -> str: ...
    @property
    def time(self) -> float: ...


def link_times(transfers: Iterable[_Transfer]) -> dict[Link, float]:
    """One report's time per link: the median of its transfers on that link.

    Links in first-seen order.
    """
    groups: dict[Link, list[float]] = {}
    for t in transfers:
        groups.setdefault((int(t.boundary), str(t.direction)), []).append(float(t.time))
    return {k: median(v) for k, v in groups.items()}


@dataclass
class LinkCombiner:
    """The ends' times of each link combined per iteration (see the module docstring).

    Keys are any hashable link key (the server's: ``(pipeline, boundary, direction)``).
    """

    #: Per key: per open iteration, per microbatch the smallest time, and the ends that reported.
    pending: dict[Any, dict[int, tuple[dict[int, float], set[str]]]] = field(default_factory=dict)
    #: Per key: per end, the latest iteration it reported.
    ends: dict[Any, dict[str, int]] = field(default_factory=dict)
    #: Per key: the latest iteration given out (a later report of it or before is dropped).
    closed: dict[Any, int] = field(default_factory=dict)

    def add(
        self, key: Any, end: str, iteration: int, times: Iterable[tuple[int, float]]
    ) -> list[float]:
        """Add one end's transfers ``(microbatch, seconds)`` of ``iteration``.

        Returns the link's time of each iteration this completes, oldest first. A report of
        an iteration already given out is dropped (an end that came late), unless it is far
        behind (a restarted rank counts from 0 again: the link starts over).
        """
        return [m for m, _ in self.add_with_fastest(key, end, iteration, times)]

    def add_with_fastest(
        self, key: Any, end: str, iteration: int, times: Iterable[tuple[int, float]]
    ) -> list[tuple[float, float]]:
        """:meth:`add`, each completed iteration as ``(median, fastest)`` over its microbatches.

        The fastest is what slow-link detection compares (a link slowed for real slows every
        transfer; a host that holds up a rank delays some of them).
        """
        done = self.closed.get(key)
        if done is not None and done - iteration >= STALE_ITERATIONS:
            self.pending.pop(key, None)
            self.ends.pop(key, None)
            self.closed.pop(key, None)
            done = None
        ends = self.ends.setdefault(key, {})
        ends[end] = iteration
        if done is not None and iteration <= done:
            return []  # an end that came late: it is waited for from now on
        for e, last in list(ends.items()):
            if last <= iteration - STALE_ITERATIONS:
                del ends[e]
        pend = self.pending.setdefault(key, {})
        per_mb, seen = pend.setdefault(iteration, ({}, set()))
        for mb, t in times:
            old = per_mb.get(mb)
            per_mb[mb] = t if old is None else min(old, t)
        seen.add(end)
        out: list[tuple[float, float]] = []
        for it in sorted(pend):
            per, got = pend[it]
            if not (got >= set(ends) or it <= iteration - STALE_ITERATIONS):
                break
            del pend[it]
            self.closed[key] = it
            if per:
                out.append(link_time(list(per.values())))
        return out


@dataclass(frozen=True)
class LinkFit:
    """One link's fitted transfer time (s per microbatch), and its time per clock.

    The time per clock (MHz) is there when measured at more than one clock.
    """

    time: float
    times_by_clock: dict[int, float] | None = None


@dataclass
class TransferSamples:
    """Per-report link times per (boundary, direction, clock) of a scan (persisted with it)."""

    samples: dict[tuple[int, str, int], list[float]] = field(default_factory=dict)

    def add(self, frequency: int, times: Mapping[Link, float]) -> None:
        """Add one report's time per link measured at clock ``frequency``."""
        for (b, d), t in times.items():
            acc = self.samples.setdefault((b, d, int(frequency)), [])
            acc.append(float(t))
            del acc[:-SAMPLES_KEPT]

    def __bool__(self) -> bool:
        return bool(self.samples)

    def to_json(self) -> list[list[Any]]:
        """The samples as JSON: one list per link and clock.

        Each list is ``[boundary, direction, frequency, *times]``.
        """
        return [[b, d, f, *v] for (b, d, f), v in self.samples.items()]

    @classmethod
    def from_json(cls, doc: list[list[Any]] | None) -> TransferSamples:
        """Read :meth:`to_json`'s document (None: no samples)."""
        return cls({(int(b), str(d), int(f)): [float(x) for x in v] for b, d, f, *v in doc or ()})


def clock_dependence(per_clock: Mapping[int, list[float]]) -> float:
    """How far apart ``per_clock``'s medians are, in standard errors (see the module docstring).

    The largest difference of two per-clock medians of ``per_clock`` (clock -> per-report times)
    in standard errors of that difference; 0 when fewer than two clocks have
    :data:`MIN_PER_CLOCK` reports, ``inf`` for a difference without any noise.
    """
    clocks = {f: v for f, v in per_clock.items() if len(v) >= MIN_PER_CLOCK}
    if len(clocks) < 2:
        return 0.0
    medians = {f: median(v) for f, v in clocks.items()}
    q1, _, q3 = statistics.quantiles(
        [x - medians[f] for f, v in clocks.items() for x in v], n=4, method="inclusive"
    )
    sigma = (q3 - q1) / 1.349
    best = 0.0
    items = sorted(clocks.items())
    for i, (f1, v1) in enumerate(items):
        for f2, v2 in items[i + 1 :]:
            diff = abs(medians[f1] - medians[f2])
            se = 1.2533 * sigma * math.sqrt(1.0 / len(v1) + 1.0 / len(v2))
            if diff > 0:
                best = max(best, diff / se if se > 0 else math.inf)
    return best


def clock_slope_t(per_clock: Mapping[int, list[float]]) -> tuple[float, int]:
    """Student's t of the slope of the per-clock medians against the clock, and its freedom.

    Only clocks with :data:`MIN_PER_CLOCK` reports count. The degrees of freedom are returned
    too: clocks - 2 (0: fewer than three clocks, t 0); ``inf`` for medians exactly on a sloped
    line.
    """
    pts = sorted((f, median(v)) for f, v in per_clock.items() if len(v) >= MIN_PER_CLOCK)
    k = len(pts)
    if k < 3:
        return 0.0, 0
    fx = sum(f for f, _ in pts) / k
    my = sum(m for _, m in pts) / k
    sxx = sum((f - fx) ** 2 for f, _ in pts)
    slope = sum((f - fx) * (m - my) for f, m in pts) / sxx
    rss = sum((m - my - slope * (f - fx)) ** 2 for f, m in pts)
    se = math.sqrt(rss / (k - 2) / sxx)
    if se == 0:
        return (math.inf if slope else 0.0), k - 2
    return abs(slope) / se, k - 2


def clock_dependent(per_clock: Mapping[int, list[float]]) -> bool:
    """Whether the data supports a per-clock time (both tests of the module docstring)."""
    if clock_dependence(per_clock) <= DEPENDENCE_Z:
        return False
    t, df = clock_slope_t(per_clock)
    if df == 0:
        return False
    from scipy.stats import t as student

    return t > float(student.ppf(0.5 + SLOPE_CONFIDENCE / 2, df))


def fit_transfers(samples: TransferSamples) -> dict[Link, LinkFit]:
    """Each measured link's :class:`LinkFit` (see the module docstring).

    One time per clock only where :func:`clock_dependent`, else the median of every per-report
    time of the link.
    """
    by_link: dict[Link, dict[int, list[float]]] = {}
    for (b, d, f), v in samples.samples.items():
        if v:
            by_link.setdefault((b, d), {})[f] = v
    out: dict[Link, LinkFit] = {}
    for link, per_clock in sorted(by_link.items()):
        if clock_dependent(per_clock):
            medians = {f: median(v) for f, v in sorted(per_clock.items())}
            out[link] = LinkFit(medians[max(medians)], medians)
        else:
            out[link] = LinkFit(median(x for v in per_clock.values() for x in v))
    return out


def with_measured_transfers(
    profile: Profile, fits: Mapping[Link, LinkFit], previous: Profile | None = None
) -> Profile:
    """``profile`` with the fitted transfer times as its communication part.

    ``profile`` is a scan's measured compute profile. What the ``previous`` profile had (of as
    many stages) is kept where nothing was measured: its phases, the links not timed, a link's
    power.
    """
    base = (
        previous.communication
        if previous is not None and previous.stages == profile.stages
        else profile.communication
    )
    transfers = dict(base.transfers)
    for (b, d), fit in fits.items():
        if not 0 <= b < profile.stages - 1:
            continue  # a boundary this profile does not have (a rank's view of virtual stages)
        old = transfers.get((b, d))
        transfers[(b, d)] = Transfer(
            fit.time, None if old is None else old.power, fit.times_by_clock
        )
    return profile.with_communication(Communication(transfers, base.phases))
