"""Slow links: a stage boundary whose measured P2P transfer time grew past its baseline.

Each iteration's timed transfers give one time per link (``(boundary, direction)``): per
microbatch the smaller of its two ends' times when both ends time it, then the median over the
microbatches (:class:`~perseus_server.decisions.link_fit.LinkCombiner`; :func:`combined_link_times`),
which the status shows. Detection compares each iteration's *fastest* transfer of the link
instead: a link slowed for real slows every transfer over it, while a host that holds up a
rank (a loaded CPU, over gloo) delays some of them, and the median followed those delays. A
link's *baseline* is the profile's transfer time for it, or, when the profile has none, the
median of the fastest transfers of its first ``consecutive`` measured iterations. The link's
factor (fastest over baseline) feeds a
:class:`~perseus_server.decisions.detectors.StageDetector` with the job's detector settings: a link
whose factor exceeds ``1 + threshold`` for ``consecutive`` iterations is slow, with the mean
measured time of those iterations; it recovers within ``1 + recovery``. A link is only called
slow when it also slows its sender's step by the threshold: the measured time's excess over the
baseline must be at least ``threshold`` times the sending instruction's profiled time at its
highest clock (:func:`sender_time`; the forward of stage ``b`` for activations, the backward
of stage ``b + 1`` for gradients), as a slow stage must be ``threshold`` slower. Without it a
link whose baseline is a fraction of a millisecond (a small tensor over a fast link) was called
slow by scheduling jitter alone, and every such call re-solved the pipeline. And a link is
compared with the same link in the job's other pipelines: its factor is divided by their common
mode (:func:`common_link_factor`), so a loaded host that delays every pipeline's transfers alike
flags none of them.

A slow link is a straggler cause like a slow stage: the pipeline's frontier is re-solved by the
:class:`~perseus_server.service.slow_stages.SlowStageResolver` with the link's measured time in
the profile's communication part (:meth:`Communication.with_transfer`), then the plans are
re-decided. The re-solve takes seconds; meanwhile the server acts from what is solved already
(:func:`act_from_frontier`): the slowed pipeline counts at once as a straggler of the matching
size, its deployed plan's time plus the link's excess once per microbatch, so the other
pipelines follow it as they follow any straggler (the slowed one keeps its plan); the re-solved
plan replaces that when it is ready. A pipeline replanned less than the replan dwell ago holds
the change until the dwell has passed (see :mod:`perseus_server.service.stragglers`). The status names each
pipeline's links (``pipelines[].links``) and slow links (``pipelines[].slow_links``), and
``/metrics`` the slow ones (``perseus_slow_link``).

Slow-link detection runs while a plan is deployed and the job's profile describes it (as for
slow stages); the measured times are kept (for the status and the baselines) all the time.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from perseus.profiles import Profile
from perseus_common.wire.values import IterationReport
from perseus_server.decisions.detectors import StageDetector
from perseus_server.decisions.planner import Straggler
from perseus_server.decisions.report_statistics import median
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.states import (
    DeploymentKind,
    DetectorEvent,
    ProfilingStatus,
    ReplanKind,
    StragglerSource,
)
from perseus_server.service.context import ServiceContext
from perseus_server.service.report_checks import CheckedReport
from perseus_server.service.slow_stages import SlowStageResolver
from perseus_server.service.state import Job, LinkKey
from perseus_server.service.stragglers import Stragglers

__all__ = [
    "LINK_WINDOW",
    "SlowLinks",
    "act_from_frontier",
    "combined_link_times",
    "common_link_factor",
    "link_views",
    "profile_transfer_time",
    "sender_time",
    "slow_link_gauges",
]

#: Per-iteration times kept per link (the status shows their median).
LINK_WINDOW = 16


def _index(boundary: int, direction: str) -> int:
    """The detector's key of a link within its pipeline."""
    return 2 * boundary + (0 if direction == "forward" else 1)


def profile_transfer_time(profile: Profile | None, boundary: int, direction: str) -> float | None:
    """The profile's transfer time of a link (None: the profile has none, or zero)."""
    if profile is None:
        return None
    t = profile.communication.transfers.get((boundary, direction))
    return float(t.time) if t is not None and t.time > 0 else None


def sender_time(profile: Profile | None, boundary: int, direction: str) -> float | None:
    """The profiled time, at its highest clock, of the instruction that sends over a link.

    The instruction is the forward of stage ``boundary`` for ``"forward"``, the backward of stage
    ``boundary + 1`` for ``"backward"``; None when the profile has neither per model stage.
    """
    if profile is None:
        return None
    stage = boundary if direction == "forward" else boundary + 1
    kinds = ("forward",) if direction == "forward" else ("backward", "backward_input")
    for kind in kinds:
        entry = profile.entries.get((stage, kind))
        if entry is not None and len(entry.times):
            return float(entry.times.min())
    return None


def combined_link_times(
    job: Job, rank: RankInfo, rep: IterationReport
) -> list[tuple[tuple[int, str], float]]:
    """The link times one report completes, in order: ``((boundary, direction), seconds)``.

    Each an iteration's fastest transfer over the link (what detection compares, see the module
    docstring): online profiling fits the profile's transfer times, the links' baselines, from
    them.
    """
    return [(link, low) for link, _, low in _combined(job, rank, rep)]


def _combined(
    job: Job, rank: RankInfo, rep: IterationReport
) -> list[tuple[tuple[int, str], float, float]]:
    """:func:`combined_link_times` with each iteration's fastest transfer too.

    As ``((boundary, direction), median, fastest)``.
    """
    groups: dict[tuple[int, str], list[tuple[int, float]]] = {}
    for t in rep.transfers:
        groups.setdefault((int(t.boundary), str(t.direction)), []).append(
            (int(t.microbatch), float(t.time))
        )
    combiner = job.stragglers.links.combiner
    p, it = rank.data_rank, int(rep.iteration)
    return [
        (link, m, low)
        for link, times in groups.items()
        for m, low in combiner.add_with_fastest((p, *link), rank.rank_id, it, times)
    ]


def baseline(job: Job, key: LinkKey) -> float | None:
    """A link's baseline: the profile's transfer time, else its first measured window's median.

    None: not measured enough yet.
    """
    t = profile_transfer_time(job.profile.current, key[1], key[2])
    return t if t is not None else job.stragglers.links.baselines.get(key)


class SlowLinks:
    """Feeds reported transfer times to the slow-link detector and re-solves on a change."""

    def __init__(
        self, ctx: ServiceContext, resolver: SlowStageResolver, stragglers: Stragglers
    ) -> None:
        self.ctx = ctx
        self.resolver = resolver
        self.stragglers = stragglers

    @staticmethod
    def _detector(job: Job) -> StageDetector:
        slow = job.stragglers
        det = slow.links.detector
        if det is None or det.settings is not slow.stage_detector.settings:
            det = slow.links.detector = StageDetector(slow.stage_detector.settings)
        return det

    def observe(self, checked: CheckedReport) -> None:
        """One accepted report with transfers (not while the job is profiled)."""
        job, rank, rep = checked.job, checked.rank, checked.report
        if not rep.transfers or job.profiling_is(ProfilingStatus.RUNNING):
            return
        p = rank.data_rank
        slow = job.stragglers
        links = slow.links
        det = self._detector(job)
        n = max(1, det.settings.consecutive)
        active = (
            job.deployment.plan is not None
            and job.frontier.current is not None
            and job.profile.current is not None
            and self.stragglers.checks.reason(job) is None
        )
        changed = False
        for (b, d), m, t in _combined(job, rank, rep):
            key = (p, b, d)
            recent = links.recent.get(key)
            if recent is None:
                recent = links.recent[key] = deque(maxlen=LINK_WINDOW)
            recent.append(m)
            fastest = links.fastest.get(key)
            if fastest is None:
                fastest = links.fastest[key] = deque(maxlen=LINK_WINDOW)
            fastest.append(t)
            base = baseline(job, key)
            if base is None:
                if len(fastest) >= n:
                    links.baselines[key] = median(list(fastest)[:n])
                continue
            if len(fastest) >= n:
                links.factors.setdefault((b, d), {})[p] = median(list(fastest)[-n:]) / base
            if not active:
                continue
            current = links.flags.get(key)
            common = common_link_factor(job, key, int(rep.iteration))
            event, factor = det.observe(
                p, _index(b, d), t / base / common, None if current is None else current / base
            )
            if event in (DetectorEvent.SLOW, DetectorEvent.CHANGED):
                if _matters(job, key, base, factor * base, det.settings.threshold):
                    links.flags[key] = factor * base
                    changed = True
                elif links.flags.pop(key, None) is not None:
                    changed = True  # its new pace no longer slows its sender: recovered
            elif event is DetectorEvent.RECOVERED:
                links.flags.pop(key, None)
                changed = True
        if changed:
            links.pending.add(p)
        if p in links.pending and active and not self.stragglers.dwelling(job, p):
            links.pending.discard(p)
            self.resolver.changed(job, p)
            act_from_frontier(self.resolver, job, p)
            self.stragglers.mark_replanned(job, p)

    def forget(self, job_id: str) -> None:
        """Nothing to do: the links' times and flags are kept on the job."""


def act_from_frontier(resolver: SlowStageResolver, job: Job, p: int) -> bool:
    """Deploy what is solved already while pipeline ``p``'s re-solve for its slow links runs.

    The re-solve was started by :meth:`SlowStageResolver.changed`. ``p`` becomes a straggler
    (source ``slow stage``, replaced by the re-solved one when it is ready, dropped with it) of
    its deployed plan's time plus each slow link's excess over its baseline once per microbatch,
    and the plans are re-decided (the other pipelines follow it). Returns whether it acted: not
    when the pipeline has no re-solve running for links only, or when a ready re-solved frontier
    still runs (it is the better plan until the new one is ready).
    """
    slow = job.stragglers
    state = slow.slow_stages.get(p)
    dep = job.deployment.current
    frontier = job.frontier.current
    if (
        state is None
        or state.ready
        or state.factors
        or not state.links
        or dep is None
        or dep.kind is not DeploymentKind.PLAN
        or frontier is None
    ):
        return False
    held = slow.stragglers.get(p)
    acted = held is not None and held.source is StragglerSource.SLOW_STAGE
    if acted and held is not None and held.detail == state.describe():
        return False  # acted on these links already
    planned = float(frontier.times[dep.indices[min(p, len(dep.indices) - 1)]])
    excess = 0.0
    for (b, d), t in state.links.items():
        base = baseline(job, (p, b, d))
        if base is not None:
            excess += max(0.0, t - base)
    t_prime = planned + job.schedule.microbatches * excess
    why = f"pipeline {p} slow {state.describe()}"
    slow.stragglers = {
        **{q: s for q, s in slow.stragglers.items() if q != p},
        p: Straggler(p, t_prime, StragglerSource.SLOW_STAGE, state.describe()),
    }
    resolver.deployer.replan(
        job,
        f"{why}: acting from the solved frontier while it is re-solved "
        f"(straggler of {t_prime:.4g} s per iteration)",
        ReplanKind.SLOW_LINK,
    )
    return True


def common_link_factor(job: Job, key: LinkKey, iteration: int) -> float:
    """How slow the same link is in the job's other pipelines: their common mode (at least 1).

    The smallest of the other pipelines' latest factors of the link (the median of their last
    few fastest transfers over the baseline, kept in :attr:`LinkState.factors`), taken once per
    iteration and link; 1 when no other pipeline has one (one pipeline) or when they are faster
    than their baselines. A host that holds up every rank (a loaded CPU) delays the link in
    every pipeline alike: the link's factor is divided by this, so it is slow only when it is
    slower than the same link elsewhere, as a pipeline is a straggler only against the
    healthiest pipeline's overhead.
    """
    p, b, d = key
    links = job.stragglers.links
    memo = links.common.get((b, d))
    if memo is None or memo[0] != iteration:
        factors = links.factors.get((b, d), {})
        memo = (iteration, tuple(sorted((f, q) for q, f in factors.items())[:2]))
        links.common[(b, d)] = memo
    others = [f for f, q in memo[1] if q != p]
    return max(1.0, others[0]) if others else 1.0


def _matters(job: Job, key: LinkKey, base: float, measured: float, threshold: float) -> bool:
    """Whether a link measured at ``measured`` s slows its sender's step by ``threshold``.

    See the module docstring; True when the profile gives no sender time to compare with.
    """
    ref = sender_time(job.profile.current, key[1], key[2])
    return ref is None or measured - base >= threshold * ref


def link_views(job: Job, p: int) -> dict[str, Any]:
    """Pipeline ``p``'s measured links and slow links (the status's ``pipelines[]`` fields)."""
    links = job.stragglers.links
    measured = []
    slow = []
    for key in sorted(k for k in links.recent if k[0] == p):
        recent = links.recent[key]
        base = baseline(job, key)
        time = median(recent)
        doc = {
            "boundary": key[1],
            "direction": key[2],
            "time": time,
            "baseline": base,
            "iterations": len(recent),
        }
        measured.append(doc)
        flagged = links.flags.get(key)
        if flagged is not None:
            slow.append(
                {
                    "boundary": key[1],
                    "direction": key[2],
                    "time": flagged,
                    "baseline": base,
                    "factor": flagged / base if base else None,
                }
            )
    return {"links": measured, "slow_links": slow}


def slow_link_gauges(jobs: Any) -> dict[tuple[tuple[str, str], ...], float]:
    """``perseus_slow_link``: 1 per slow link, by job, pipeline, boundary and direction.

    Label values come from bounded sets: the job's pipelines, its model's boundaries, two
    directions.
    """
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for job in jobs:
        for p, b, d in job.stragglers.links.flags:
            out[
                (
                    ("boundary", str(b)),
                    ("direction", d),
                    ("perseus_job", job.id),
                    ("pipeline", str(p)),
                )
            ] = 1.0
    return out
