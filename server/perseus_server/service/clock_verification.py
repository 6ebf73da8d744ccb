"""Applied-clock verification on the server: which ranks ran instructions off-plan, and why.

Clients sample the SM clock their GPU runs at while an instruction runs (off the training
thread) and report, per iteration, the instructions that ran more than one supported clock step
below their locked clock, with NVML's clock-event (throttle) reasons (``IterationReport.off_plan``,
``clock_samples``, ``clock_event_reasons``; see the client's ``perseus_client.gpu.applied``).
This module

- validates those fields (:func:`validate_applied_clocks`; bounded, named errors);
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

A report has at most :data:`MAX_OFF_PLAN` off-plan instructions. Everything is linear in them;
the counter is updated once per distinct label of a report.
"""

from __future__ import annotations

import re
from typing import Any

from perseus.profiles import INSTRUCTION_KINDS
from perseus_common.clocks import CLOCK_EVENT_REASON_NAMES
from perseus_common.clocks import MAX_CLOCK_MHZ as MAX_FREQUENCY_MHZ
from perseus_server.config import Limits
from perseus_server.decisions.detectors import RankClocks
from perseus_server.domain.errors import BadRequest
from perseus_server.domain.jobs import RankInfo
from perseus_server.domain.values import IterationReport
from perseus_server.metrics import Counter
from perseus_server.service.state import Job

__all__ = [
    "CAUSE",
    "ClockVerification",
    "KNOWN_REASONS",
    "MAX_OFF_PLAN",
    "MAX_REASONS",
    "detector_feeder",
    "off_plan_ranks",
    "rank_view",
    "validate_applied_clocks",
]

#: The straggler cause the status names while a pipeline has an off-plan rank.
CAUSE = "off-plan clocks"
#: At most this many reason names per off-plan instruction or report.
MAX_REASONS = 32
#: At most this many off-plan instructions per report.
MAX_OFF_PLAN = 4096
#: NVML's clock-event reason names, as the client sends them (the shared table,
#: :data:`perseus_common.clocks.CLOCK_EVENT_REASONS`); others are counted as ``other``.
KNOWN_REASONS = CLOCK_EVENT_REASON_NAMES
_REASON = re.compile(r"[a-z0-9_]{1,64}")


def _check_reasons(where: str, reasons: tuple[str, ...], field: str) -> None:
    if len(reasons) > MAX_REASONS:
        raise BadRequest(f"{where}: at most {MAX_REASONS} reasons", field=field)
    for r in reasons:
        if not _REASON.fullmatch(r):
            raise BadRequest(
                f"{where}: a reason is 1 to 64 of [a-z0-9_], got {r[:80]!r}", field=field
            )


def validate_applied_clocks(i: int, rep: IterationReport, job: Job, limits: Limits) -> None:
    """Raise :class:`BadRequest` naming the field when report ``i``'s applied-clock fields are
    malformed (old clients send none: nothing to check)."""
    if rep.clock_samples < 0:
        raise BadRequest(
            f"report {i}: must be >= 0, got {rep.clock_samples}", field="clock_samples"
        )
    _check_reasons(f"report {i}", rep.clock_event_reasons, "clock_event_reasons")
    most = min(MAX_OFF_PLAN, limits.max_report_instructions)
    if len(rep.off_plan) > most:
        raise BadRequest(
            f"report {i}: off_plan has {len(rep.off_plan)} instructions, at most {most}",
            field="off_plan",
        )
    for j, o in enumerate(rep.off_plan):
        where = f"report {i} off_plan[{j}]"
        if o.instruction not in INSTRUCTION_KINDS:
            raise BadRequest(
                f"{where}: unknown instruction {o.instruction!r}", field="off_plan.instruction"
            )
        if not 0 <= o.microbatch < job.spec.microbatches:
            raise BadRequest(f"{where}: microbatch out of range", field="off_plan.microbatch")
        if o.stage is not None and not 0 <= o.stage < job.schedule.stages:
            raise BadRequest(f"{where}: stage out of range", field="off_plan.stage")
        for name, mhz in (("locked_mhz", o.locked_mhz), ("sampled_mhz", o.sampled_mhz)):
            if not 0 <= mhz <= MAX_FREQUENCY_MHZ:
                raise BadRequest(
                    f"{where}: {name} must be between 0 and {MAX_FREQUENCY_MHZ} MHz",
                    field=f"off_plan.{name}",
                )
        if o.samples < 0:
            raise BadRequest(f"{where}: samples must be >= 0", field="off_plan.samples")
        _check_reasons(where, o.reasons, "off_plan.reasons")


def _reason_label(reasons: tuple[str, ...]) -> str:
    return "+".join(sorted({r if r in KNOWN_REASONS else "other" for r in reasons})) or "none"


class ClockVerification:
    """Takes the applied-clock fields of accepted reports (see the module docstring)."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def observe(self, job: Job, rank: RankInfo, rep: IterationReport) -> None:
        """One accepted (not re-sent) report of ``rank``: update its record and the counter."""
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
            self.counter.inc(n, job=job.id, rank=str(rank.global_rank), reason=label)
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


def off_plan_ranks(job: Job, pipeline: int) -> list[RankInfo]:
    """The ranks of ``pipeline`` that ran off-plan within their window, lowest global rank
    first."""
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
    """The global rank whose reports feed ``pipeline``'s iteration detector: its lowest-ranked
    off-plan rank, else its leader (lowest global rank); ``None``: no rank registered."""
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
