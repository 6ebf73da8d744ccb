"""Applied-clock verification on the server: which ranks ran instructions off-plan, and why.

Clients sample the SM clock their GPU runs at while an instruction runs (off the training
thread) and report, per iteration, the instructions that ran more than one supported clock step
below their locked clock, with NVML's clock-event (throttle) reasons (``IterationReport.off_plan``,
``clock_samples``, ``clock_event_reasons``; see the client's ``perseus_client.gpu.applied``).
Their fields are validated with the report's others
(:func:`~perseus_server.service.report_checks.validate_applied_clocks`). This module

- keeps each rank's record of its last :data:`~perseus_server.decisions.detectors.OFF_PLAN_WINDOW`
  iterations in the job's straggler detector (:meth:`ClockVerification.observe`), which the
  straggler logic reads (:func:`detector_feeder`: an off-plan rank's measured times feed the
  detector);
- counts off-plan instructions in ``/metrics`` as
  ``perseus_off_plan_instructions_total{job, rank, reason}`` (``rank``: the global rank;
  ``reason``: the instruction's reasons joined by ``+``, sorted, or ``none``, so that the sum over
  ``reason`` counts each instruction once; a name outside :data:`KNOWN_REASONS`, NVML's fixed set
  the client sends, counts as ``other``, so a rank has at most ``2**10`` series);
- renders the per-rank summary of ``GET /jobs/{id}/status`` (:func:`rank_view`) and the
  pipeline's off-plan ranks (:func:`off_plan_ranks`).

A report has at most :data:`~perseus_server.service.report_checks.MAX_OFF_PLAN` off-plan
instructions. Everything is linear in them;
the counter is updated once per distinct label of a report.
"""

from __future__ import annotations

from typing import Any

from perseus_common.clocks import CLOCK_EVENT_REASON_NAMES
from perseus_server.decisions.detectors import RankClocks
from perseus_server.domain.jobs import RankInfo
from perseus_server.metric_series import Counter
from perseus_server.service.report_checks import CheckedReport
from perseus_server.service.state import Job

__all__ = [
    "CAUSE",
    "ClockVerification",
    "KNOWN_REASONS",
    "detector_feeder",
    "off_plan_ranks",
    "rank_view",
]

#: The straggler cause the status names while a pipeline has an off-plan rank.
CAUSE = "off-plan clocks"
#: NVML's clock-event reason names, as the client sends them (the shared table,
#: :data:`perseus_common.clocks.CLOCK_EVENT_REASONS`); others are counted as ``other``.
KNOWN_REASONS = CLOCK_EVENT_REASON_NAMES


def _reason_label(reasons: tuple[str, ...]) -> str:
    return "+".join(sorted({r if r in KNOWN_REASONS else "other" for r in reasons})) or "none"


class ClockVerification:
    """Takes the applied-clock fields of accepted reports (see the module docstring)."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def observe(self, checked: CheckedReport) -> None:
        """One accepted (not re-sent) report of a rank: update its record and the counter."""
        job, rank, rep = checked.job, checked.rank, checked.report
        clocks = job.stragglers.detector.clocks
        record = clocks.get(rank.rank_id)
        if record is None:
            if not rep.clock_samples and not rep.off_plan:
                return  # this rank does not verify its clocks: keep no record
            record = clocks[rank.rank_id] = RankClocks()
        reasons: set[str] = set()
        counts: dict[str, int] = {}
        for o in rep.off_plan:
            reasons.update(o.reasons)
            label = _reason_label(o.reasons)
            counts[label] = counts.get(label, 0) + 1
        for label, n in counts.items():
            self.counter.inc(n, perseus_job=job.id, rank=str(rank.global_rank), reason=label)
        record.recent.append(
            (int(rep.iteration), len(rep.off_plan), frozenset(reasons), int(rep.clock_samples))
        )
        if rep.off_plan:
            record.total += len(rep.off_plan)
            worst = min(rep.off_plan, key=lambda o: o.sampled_mhz - o.locked_mhz)
            record.last = {
                "iteration": int(rep.iteration),
                "instruction": worst.instruction,
                "microbatch": worst.microbatch,
                "stage": rank.pipeline_rank if worst.stage is None else worst.stage,
                "locked_mhz": worst.locked_mhz,
                "sampled_mhz": worst.sampled_mhz,
                "reasons": sorted(set(worst.reasons)),
            }

    def forget(self, job_id: str) -> None:
        """Nothing to do: the ranks' records are kept on the job."""


def off_plan_ranks(job: Job, pipeline: int) -> list[RankInfo]:
    """The ranks of ``pipeline`` that ran off-plan within their window.

    Lowest global rank first.
    """
    clocks = job.stragglers.detector.clocks
    return sorted(
        (
            r
            for r in job.ranks.by_global.values()
            if r.data_rank == pipeline and (c := clocks.get(r.rank_id)) is not None and c.off_plan
        ),
        key=lambda r: r.global_rank,
    )


def detector_feeder(job: Job, pipeline: int) -> int | None:
    """The global rank whose reports feed ``pipeline``'s iteration detector.

    Its lowest-ranked off-plan rank, else its leader (lowest global rank); ``None``: no rank
    registered.
    """
    off = off_plan_ranks(job, pipeline)
    if off:
        return off[0].global_rank
    return min(
        (r.global_rank for r in job.ranks.by_global.values() if r.data_rank == pipeline),
        default=None,
    )


def rank_view(job: Job, rank_id: str) -> dict[str, Any] | None:
    """The status document's ``applied_clocks`` of a rank (``None``: it reported no samples)."""
    record = job.stragglers.detector.clocks.get(rank_id)
    if record is None:
        return None
    reasons: set[str] = set()
    for _, _, seen, _ in record.recent:
        reasons |= seen
    return {
        "off_plan": record.off_plan,
        "window_iterations": len(record.recent),
        "samples": sum(s for _, _, _, s in record.recent),
        "off_plan_instructions": sum(c for _, c, _, _ in record.recent),
        "off_plan_iterations": sum(1 for _, c, _, _ in record.recent if c),
        "reasons": sorted(reasons),
        "total_off_plan_instructions": record.total,
        "last_off_plan": record.last,
    }
