"""Measured P2P transfer times: one report's time per link, and the fit online profiling gives
the profile's communication part.

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
clock) and fits each link's time as their median (:func:`fit_transfers`): the time at the
highest clock measured, and one time per clock when more than one was measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from perseus.profiles import Profile
from perseus_common.communication import Communication, Transfer

__all__ = [
    "SAMPLES_KEPT",
    "LinkCombiner",
    "LinkFit",
    "STALE_ITERATIONS",
    "TransferSamples",
    "fit_transfers",
    "link_times",
    "median",
    "with_measured_transfers",
]

#: Per-report times kept per link and clock during a scan (the latest ones).
SAMPLES_KEPT = 32
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


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (at least one)."""
    a = sorted(values)
    h = len(a) // 2
    return a[h] if len(a) % 2 else (a[h - 1] + a[h]) / 2


def link_times(transfers: Iterable[_Transfer]) -> dict[Link, float]:
    """One report's time per link: the median of its transfers on that link (links in first-seen
    order)."""
    groups: dict[Link, list[float]] = {}
    for t in transfers:
        groups.setdefault((int(t.boundary), str(t.direction)), []).append(float(t.time))
    return {k: median(v) for k, v in groups.items()}


@dataclass
class LinkCombiner:
    """The ends' times of each link combined per iteration (see the module docstring). Keys are
    any hashable link key (the server's: ``(pipeline, boundary, direction)``)."""

    #: Per key: per open iteration, per microbatch the smallest time, and the ends that reported.
    pending: dict[Any, dict[int, tuple[dict[int, float], set[str]]]] = field(default_factory=dict)
    #: Per key: per end, the latest iteration it reported.
    ends: dict[Any, dict[str, int]] = field(default_factory=dict)
    #: Per key: the latest iteration given out (a later report of it or before is dropped).
    closed: dict[Any, int] = field(default_factory=dict)

    def add(
        self, key: Any, end: str, iteration: int, times: Iterable[tuple[int, float]]
    ) -> list[float]:
        """One end's transfers ``(microbatch, seconds)`` of ``iteration``; returns the link's
        time of each iteration this completes, oldest first. A report of an iteration already
        given out is dropped (an end that came late), unless it is far behind (a restarted rank
        counts from 0 again: the link starts over)."""
        return [m for m, _ in self.add_with_fastest(key, end, iteration, times)]

    def add_with_fastest(
        self, key: Any, end: str, iteration: int, times: Iterable[tuple[int, float]]
    ) -> list[tuple[float, float]]:
        """:meth:`add`, each completed iteration as ``(median, fastest)`` over its microbatches:
        the fastest is what slow-link detection compares (a link slowed for real slows every
        transfer; a host that holds up a rank delays some of them)."""
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
                out.append((median(per.values()), min(per.values())))
        return out


@dataclass(frozen=True)
class LinkFit:
    """One link's fitted transfer time (s per microbatch) and, when measured at more than one
    clock, its time per clock (MHz)."""

    time: float
    times_by_clock: dict[int, float] | None = None


@dataclass
class TransferSamples:
    """Per-report link times per (boundary, direction, clock) of a scan (persisted with it)."""

    samples: dict[tuple[int, str, int], list[float]] = field(default_factory=dict)

    def add(self, frequency: int, times: Mapping[Link, float]) -> None:
        for (b, d), t in times.items():
            acc = self.samples.setdefault((b, d, int(frequency)), [])
            acc.append(float(t))
            del acc[:-SAMPLES_KEPT]

    def __bool__(self) -> bool:
        return bool(self.samples)

    def to_json(self) -> list[list[Any]]:
        return [[b, d, f, *v] for (b, d, f), v in self.samples.items()]

    @classmethod
    def from_json(cls, doc: list[list[Any]] | None) -> TransferSamples:
        return cls({(int(b), str(d), int(f)): [float(x) for x in v] for b, d, f, *v in doc or ()})


def fit_transfers(samples: TransferSamples) -> dict[Link, LinkFit]:
    """Each measured link's :class:`LinkFit`: per clock the median of its per-report times; the
    link's time is the one at the highest clock measured."""
    by_link: dict[Link, dict[int, float]] = {}
    for (b, d, f), v in samples.samples.items():
        if v:
            by_link.setdefault((b, d), {})[f] = median(v)
    out: dict[Link, LinkFit] = {}
    for link, per_clock in sorted(by_link.items()):
        top = per_clock[max(per_clock)]
        out[link] = LinkFit(top, dict(sorted(per_clock.items())) if len(per_clock) > 1 else None)
    return out


def with_measured_transfers(
    profile: Profile, fits: Mapping[Link, LinkFit], previous: Profile | None = None
) -> Profile:
    """``profile`` (a scan's measured compute profile) with the fitted transfer times as its
    communication part. What the ``previous`` profile had (of as many stages) is kept where
    nothing was measured: its phases, the links not timed, a link's power."""
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
