"""What a job draws on the power budget: only its complete pipelines (``service/budget_draw.py``)."""

from __future__ import annotations

from perseus_server.domain.jobs import JobSpec, RankInfo
from perseus_server.domain.rows import JobRow
from perseus_server.service.budget_draw import (
    counted_pipelines,
    draw_view,
    pipeline_width,
    why_drawn,
)
from perseus_server.service.state import Job


def _job(pipelines: int, tensor_parallel: int = 1) -> Job:
    spec = JobSpec(
        stages=2, microbatches=4, data_parallel=pipelines, tensor_parallel=tensor_parallel
    )
    return Job(row=JobRow("j", 0.0, spec), schedule=spec.build_schedule())


def _connect(job: Job, pipeline: int, ranks: int) -> None:
    width = pipeline_width(job)
    for i in range(ranks):
        g = pipeline * width + i
        job.ranks.add(RankInfo("j", f"j-{g}", g, i % 2, pipeline, 0, "NVIDIA A40", (), "h"))


def test_a_pipeline_counts_only_with_every_rank_of_every_stage_and_tensor_slice() -> None:
    job = _job(pipelines=3, tensor_parallel=2)
    assert pipeline_width(job) == 4
    _connect(job, 0, 4)
    _connect(job, 1, 3)
    assert counted_pipelines(job) == 1
    _connect(job, 1, 3)  # the same ranks again: still three of four
    assert counted_pipelines(job) == 1


def test_the_why_says_what_is_counted_and_names_the_incomplete_pipelines() -> None:
    job = _job(pipelines=2)
    assert why_drawn(job, active=True) == "not started (no rank registered)"
    assert why_drawn(job, active=False) == "not active (idle or finished)"
    _connect(job, 1, 1)
    assert why_drawn(job, active=True) == (
        "no pipeline has all its ranks connected: it draws nothing; "
        "pipeline 1 has 1 of 2 ranks connected: not counted"
    )
    _connect(job, 0, 2)
    assert why_drawn(job, active=True) == (
        "1 of 2 pipeline(s) have all their ranks connected: counted; "
        "pipeline 1 has 1 of 2 ranks connected: not counted"
    )


def test_past_four_incomplete_pipelines_the_rest_are_summed_up() -> None:
    job = _job(pipelines=7)
    for d in range(7):
        _connect(job, d, 1)
    why = why_drawn(job, active=True)
    assert [f"pipeline {d} has" in why for d in range(7)] == [True] * 4 + [False] * 3
    assert why.endswith("3 more pipeline(s) with some ranks connected: not counted")


def test_the_status_view_counts_nothing_for_an_inactive_job() -> None:
    job = _job(pipelines=2)
    _connect(job, 0, 2)
    assert draw_view(job, active=True) == {
        "pipelines_counted": 1,
        "pipelines": 2,
        "ranks_per_pipeline": 2,
        "why": why_drawn(job, active=True),
    }
    idle = draw_view(job, active=False)
    assert idle["pipelines_counted"] == 0 and idle["why"] == "not active (idle or finished)"
