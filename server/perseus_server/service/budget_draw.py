"""What a job draws on the cluster power budget: only the pipelines that can run.

A pipeline can run only once every one of its ranks (``stages x tensor_parallel`` of them) is
connected (registered); one rank missing and the whole pipeline waits. So a job counts toward
the budget (its claim and its demand) only for its *complete* pipelines, and draws nothing
until it has one: registering one rank of a 1,024-GPU job takes nothing from anyone.

The explanation (``why``) is shown in the job's status (``power_draw``) and in the budget's
``left_out``: e.g. ``1 of 2 pipelines counted; pipeline 1 has 3 of 4 ranks connected: not
counted``.
"""

from __future__ import annotations

from typing import Any

from perseus_server.service.state import Job

__all__ = ["counted_pipelines", "draw_view", "pipeline_width", "why_drawn"]

#: The incomplete pipelines a reason names one by one (the rest are summed up).
NAMED = 4


def pipeline_width(job: Job) -> int:
    """The ranks one pipeline needs: ``stages x tensor_parallel``."""
    return job.spec.stages * job.spec.tensor_parallel


def counted_pipelines(job: Job) -> int:
    """How many of the job's pipelines have every rank connected (what it draws for)."""
    return job.ranks.complete(pipeline_width(job))


def _incomplete(job: Job) -> list[str]:
    width = pipeline_width(job)
    short = sorted((d, n) for d, n in job.ranks.per_pipeline.items() if n < width)
    out = [
        f"pipeline {d} has {n} of {width} ranks connected: not counted" for d, n in short[:NAMED]
    ]
    if len(short) > NAMED:
        out.append(f"{len(short) - NAMED} more pipeline(s) with some ranks connected: not counted")
    return out


def why_drawn(job: Job, active: bool, inactive: str = "not active (idle or finished)") -> str:
    """Why the job draws what it draws, in words."""
    if not active:
        return inactive
    if not job.ranks.by_global:
        return "not started (no rank registered)"
    counted, total = counted_pipelines(job), job.spec.data_parallel
    head = (
        "no pipeline has all its ranks connected: it draws nothing"
        if counted == 0
        else f"{counted} of {total} pipeline(s) have all their ranks connected: counted"
    )
    return "; ".join([head, *_incomplete(job)])


def draw_view(job: Job, active: bool) -> dict[str, Any]:
    """The status's ``power_draw``: the pipelines counted toward the budget, and why."""
    counted = counted_pipelines(job) if active else 0
    return {
        "pipelines_counted": counted,
        "pipelines": job.spec.data_parallel,
        "ranks_per_pipeline": pipeline_width(job),
        "why": why_drawn(job, active),
    }
